"""Makes the fp32 Kokoro graph from the dynamically quantized int8 one (ops/install-kokoro.sh).

    python3 kokoro_fp32.py model.onnx model.fp32.onnx

The int8 export quantizes weights for ONNX Runtime's CPU kernels: MatMulInteger and
ConvInteger fed by DynamicQuantizeLinear, and DynamicQuantizeLSTM. Those kernels exist on
the CPU only, so on a GPU such a graph would run its heavy nodes on the CPU. This rewrites
each of them as the float op it stands for, with the weight dequantized once here:
W = (W_q - zero_point) * scale. Everything else (names, inputs, outputs, the durations
tensor narrator exposes) stays as it was. Needs the `onnx` and `numpy` packages.
"""

import sys
from collections import defaultdict

import numpy as np
import onnx
from onnx import helper, numpy_helper


def main(src, dst):
    model = onnx.load(src)
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    arr = lambda name: numpy_helper.to_array(inits[name])
    producer = {o: n for n in g.node for o in n.output}
    consumers = defaultdict(list)
    for n in g.node:
        for i in n.input:
            consumers[i].append(n)
    remove = set()  # ids of nodes to drop
    add = []  # (position anchor node, new node)
    new_inits = []
    made = {}  # fp32 weight name -> values (one weight may feed several nodes)

    def float_bias(name, depth=6):
        # The float initializer a run-time quantized bias is computed from.
        frontier = [name]
        for _ in range(depth):
            nxt = []
            for t in frontier:
                if t in inits:
                    a = arr(t)
                    if a.dtype == np.float32 and a.ndim == 1 and "scale" not in t and "quantized" not in t:
                        return t
                elif t in producer:
                    nxt.extend(producer[t].input)
            frontier = nxt
        return None

    def scale_of(mul_node, xscale_name):
        # The scale Mul multiplies the input's scale by the weight's (an initializer).
        other = [i for i in mul_node.input if i != xscale_name]
        return arr(other[0]) if other and other[0] in inits else None

    for n in list(g.node):
        if n.op_type not in ("MatMulInteger", "ConvInteger"):
            continue
        xq, wq = n.input[0], n.input[1]
        wzp = n.input[3] if len(n.input) > 3 else None
        dql = producer.get(xq)
        if dql is None or dql.op_type != "DynamicQuantizeLinear" or wq not in inits:
            continue
        x, xscale = dql.input[0], dql.output[1]
        after = consumers[n.output[0]]
        bias, bias_add = None, None
        if len(after) == 1 and after[0].op_type == "Add" and n.op_type == "ConvInteger":
            # ConvInteger + a bias quantized at run time (float bias / the run's scale):
            # the float conv takes the float bias itself.
            bias_add = after[0]
            bias = float_bias([i for i in bias_add.input if i != n.output[0]][0])
            if bias is None:
                print(f"kokoro_fp32: {n.name}: no float bias found", file=sys.stderr)
                continue
            after = consumers[bias_add.output[0]]
        if len(after) != 1 or after[0].op_type != "Cast":
            continue
        cast = after[0]
        after = consumers[cast.output[0]]
        if len(after) != 1 or after[0].op_type != "Mul":
            print(f"kokoro_fp32: {n.name}: {[a.op_type for a in after]} after its Cast", file=sys.stderr)
            continue
        out_mul = after[0]
        others = [i for i in out_mul.input if i != cast.output[0]]
        if not others or others[0] not in producer:
            print(f"kokoro_fp32: {n.name}: its scale is {others}", file=sys.stderr)
            continue
        scale_mul = producer[others[0]]
        ws = scale_of(scale_mul, xscale)
        if ws is None:
            continue
        w = arr(wq).astype(np.int32)
        if wzp:
            zp = arr(wzp).astype(np.int32)
            if n.op_type == "ConvInteger" and zp.ndim == 1 and zp.size > 1:
                zp = zp.reshape((-1,) + (1,) * (w.ndim - 1))
            w = w - zp
        scale = np.asarray(ws, dtype=np.float32)
        if n.op_type == "ConvInteger" and scale.ndim == 1 and scale.size > 1:
            # Per-output-channel scales apply along the first axis of a conv weight.
            scale = scale.reshape((-1,) + (1,) * (w.ndim - 1))
        wf = (w.astype(np.float32) * scale).astype(np.float32)
        wname = wq + "_fp32"
        if wname in made:
            if not np.array_equal(made[wname], wf):
                wname = f"{wq}_fp32_{len(made)}"
        if wname not in made:
            made[wname] = wf
            new_inits.append(numpy_helper.from_array(wf, wname))
        op = "MatMul" if n.op_type == "MatMulInteger" else "Conv"
        node = helper.make_node(op, [x, wname] + ([bias] if bias else []), [out_mul.output[0]], name=n.name + "_fp32")
        if op == "Conv":
            node.attribute.extend(n.attribute)
        add.append((n, node))
        remove.update({id(n), id(cast), id(out_mul)} | ({id(bias_add)} if bias_add else set()))

    for n in list(g.node):
        if n.op_type != "DynamicQuantizeLSTM":
            continue
        names = list(n.input) + [""] * (12 - len(n.input))
        x, w, r, b, seq, h0, c0, p, ws, wzp, rs, rzp = names
        def deq(q, zp, sc):
            # Scales and zero points are per direction, or per direction and gate column.
            shape = lambda a: a.reshape(a.shape[0], 1, -1) if a.ndim == 2 else a.reshape(-1, 1, 1)
            return (arr(q).astype(np.int32) - shape(arr(zp).astype(np.int32))) * shape(arr(sc))

        wf, rf = deq(w, wzp, ws), deq(r, rzp, rs)
        # DynamicQuantizeLSTM keeps W as [dirs, input, 4H]; LSTM wants [dirs, 4H, input].
        wname, rname = w + "_fp32", r + "_fp32"
        new_inits.append(numpy_helper.from_array(np.transpose(wf, (0, 2, 1)).astype(np.float32), wname))
        new_inits.append(numpy_helper.from_array(np.transpose(rf, (0, 2, 1)).astype(np.float32), rname))
        inputs = [x, wname, rname, b, seq, h0, c0, p]
        while inputs and inputs[-1] == "":
            inputs.pop()
        node = helper.make_node("LSTM", inputs, list(n.output), name=n.name + "_fp32")
        node.attribute.extend(n.attribute)
        add.append((n, node))
        remove.add(id(n))

    placed = {id(old): new for old, new in add}
    nodes = []
    for n in g.node:
        if id(n) in placed:
            nodes.append(placed[id(n)])
        elif id(n) not in remove:
            nodes.append(n)
    # Drop what nothing reads any more (DynamicQuantizeLinear, the scale Muls, the int8
    # weights), repeatedly.
    outputs = {o.name for o in g.output}
    while True:
        used = {i for n in nodes for i in n.input} | outputs
        keep = [n for n in nodes if any(o in used for o in n.output)]
        if len(keep) == len(nodes):
            break
        nodes = keep
    used = {i for n in nodes for i in n.input}
    initializers = [i for i in g.initializer if i.name in used] + [i for i in new_inits if i.name in used]
    del g.node[:]
    g.node.extend(nodes)
    del g.initializer[:]
    g.initializer.extend(initializers)
    left = sorted({n.op_type for n in g.node if "Integer" in n.op_type or n.op_type.startswith("DynamicQuantize")})
    if left:
        sys.exit(f"kokoro_fp32: quantized nodes left: {left}")
    onnx.checker.check_model(model)
    onnx.save(model, dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
