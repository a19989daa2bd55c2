//! Exposes an internal tensor of an ONNX model as an extra graph output, at load time.
//!
//! The stock Piper export has no output that says how many samples of a padded batch
//! belong to each item. The tensor `/Ceil_output_0` (frames per phoneme, `[batch, 1,
//! phonemes]`) carries exactly that, but ONNX Runtime only returns declared graph outputs.
//! Protobuf merges a repeated occurrence of a singular message field into the first one, so
//! appending `ModelProto.graph { output: ValueInfoProto{..} }` to the serialized model adds
//! one entry to `graph.output` without re-encoding the 60 MB around it. No protobuf crate is
//! needed (the ones available were unmaintained or dropped explicit zeros).

/// ModelProto field 7: `GraphProto graph`.
const MODEL_GRAPH: u64 = 7;
/// GraphProto field 12: `repeated ValueInfoProto output`.
const GRAPH_OUTPUT: u64 = 12;

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    put_varint(out, (field << 3) | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn put_int(out: &mut Vec<u8>, field: u64, v: u64) {
    put_varint(out, field << 3);
    put_varint(out, v);
}

/// One dimension of a `TensorShapeProto`: a fixed size or a symbolic name.
#[derive(Debug, Clone, Copy)]
pub enum Dim<'a> {
    /// `dim_value`
    Fixed(u64),
    /// `dim_param`
    Named(&'a str),
}

/// Serialized `ValueInfoProto` for a float tensor with the given shape.
fn float_value_info(name: &str, dims: &[Dim<'_>]) -> Vec<u8> {
    let mut shape = Vec::new();
    for d in dims {
        let mut dim = Vec::new();
        match d {
            Dim::Fixed(v) => put_int(&mut dim, 1, *v),
            Dim::Named(n) => put_bytes(&mut dim, 2, n.as_bytes()),
        }
        put_bytes(&mut shape, 1, &dim);
    }
    let mut tensor = Vec::new();
    put_int(&mut tensor, 1, 1); // elem_type FLOAT
    put_bytes(&mut tensor, 2, &shape);
    let mut ty = Vec::new();
    put_bytes(&mut ty, 1, &tensor); // TypeProto.tensor_type
    let mut info = Vec::new();
    put_bytes(&mut info, 1, name.as_bytes());
    put_bytes(&mut info, 2, &ty);
    info
}

/// Appends a float graph output named `name` with shape `dims` to the serialized model.
pub fn append_float_output(model: &mut Vec<u8>, name: &str, dims: &[Dim<'_>]) {
    let mut graph = Vec::new();
    put_bytes(&mut graph, GRAPH_OUTPUT, &float_value_info(name, dims));
    put_bytes(model, MODEL_GRAPH, &graph);
}

/// Whether `needle` occurs in the model bytes (node output names are stored verbatim).
pub fn mentions(model: &[u8], needle: &str) -> bool {
    let n = needle.as_bytes();
    !n.is_empty() && model.windows(n.len()).any(|w| w == n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_encode_like_protobuf() {
        let mut v = Vec::new();
        put_varint(&mut v, 300);
        assert_eq!(v, [0xAC, 0x02]);
        let mut v = Vec::new();
        put_varint(&mut v, 1);
        assert_eq!(v, [1]);
    }

    #[test]
    fn appended_output_is_a_graph_field_holding_one_value_info() {
        let mut model = vec![0x08, 0x07]; // ir_version = 7
        append_float_output(&mut model, "x", &[Dim::Named("b"), Dim::Fixed(1)]);
        assert_eq!(&model[..2], &[0x08, 0x07]);
        assert_eq!(model[2], (7 << 3) | 2, "ModelProto.graph tag");
        let graph_len = model[3] as usize;
        assert_eq!(model.len(), 4 + graph_len);
        assert_eq!(model[4], (12 << 3) | 2, "GraphProto.output tag");
        assert!(mentions(&model, "x"));
    }
}
