//! Calibrations by GPU model: the ones shipped in the binary (`calibrations/*.json` of
//! this crate, measured on that model), files given on the command line, and the fleet's
//! database table; later additions win over earlier ones for the same voice, model and
//! runtime.
//!
//! A plan for a GPU model uses that model's calibration when one is known
//! ([`Catalog::plan`]); otherwise the **memory-only rule**: the batch is what free memory
//! holds (free memory × (1 − safety margin), less the fixed part, at the memory per
//! padded token of the calibration at hand), capped at [`PlanLimits::uncurved_gpu_items`]
//! sentence-sized items (64) because no throughput curve says where batching stops
//! paying. The plan's `reason` says which applied.

use serde::Serialize;

use crate::plan::{Calibration, DeviceSpec, Plan, PlanLimits, plan};

mod shipped {
    include!(concat!(env!("OUT_DIR"), "/shipped.rs"));
}

/// Where a catalog entry came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Origin(pub String);

/// Known calibrations.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    entries: Vec<(Calibration, Origin)>,
}

/// Why a calibration file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// Unreadable file.
    #[error("cannot read calibration {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Not a calibration.
    #[error(
        "{path} is not a narrator calibration ({source}); use the JSON `narrator plan --json` prints as calibration_full"
    )]
    Parse {
        /// The file.
        path: String,
        /// The cause.
        source: serde_json::Error,
    },
    /// A calibration without a GPU model cannot be looked up.
    #[error(
        "{path}: device_model is {model:?}; a shipped or shared calibration names a GPU model as NVML does (e.g. \"NVIDIA H200\")"
    )]
    NoModel {
        /// The file.
        path: String,
        /// Its device model.
        model: String,
    },
}

/// Model names compare without case or repeated spaces ("NVIDIA  h200" = "NVIDIA H200").
fn same_model(a: &str, b: &str) -> bool {
    let norm = |s: &str| {
        s.split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .to_lowercase()
    };
    norm(a) == norm(b)
}

impl Catalog {
    /// The calibrations built into this binary.
    pub fn shipped() -> Result<Self, CatalogError> {
        let mut c = Self::default();
        for (name, json) in shipped::SHIPPED {
            c.add_json(json, &format!("shipped {name}"))?;
        }
        Ok(c)
    }

    /// Adds a calibration read from JSON text; `origin` names it in plans.
    pub fn add_json(&mut self, json: &str, origin: &str) -> Result<(), CatalogError> {
        let c: Calibration = serde_json::from_str(json).map_err(|source| CatalogError::Parse {
            path: origin.to_owned(),
            source,
        })?;
        if matches!(c.device_model.as_str(), "" | "cpu" | "any") {
            return Err(CatalogError::NoModel {
                path: origin.to_owned(),
                model: c.device_model,
            });
        }
        self.add(c, origin);
        Ok(())
    }

    /// Adds a calibration file.
    pub fn add_file(&mut self, path: &std::path::Path) -> Result<(), CatalogError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| CatalogError::Read {
            path: shown.clone(),
            source,
        })?;
        self.add_json(&text, &shown)
    }

    /// Adds a calibration; it wins over earlier ones with the same key.
    pub fn add(&mut self, c: Calibration, origin: &str) {
        self.entries.push((c, Origin(origin.to_owned())));
    }

    /// How many calibrations are known.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is known.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The calibration of `voice` on `model`: the latest added with the same `runtime`,
    /// else the latest with any runtime (a calibration from another ONNX Runtime version
    /// is closer than none).
    pub fn find(&self, voice: &str, model: &str, runtime: &str) -> Option<(&Calibration, &Origin)> {
        let matching = || {
            self.entries
                .iter()
                .rev()
                .filter(|(c, _)| c.voice == voice && same_model(&c.device_model, model))
        };
        matching()
            .find(|(c, _)| c.runtime == runtime)
            .or_else(|| matching().next())
            .map(|(c, o)| (c, o))
    }

    /// The plan for `device`: from its model's calibration when known (the reason says
    /// where it came from), else by the memory-only rule with `memory` (the calibration
    /// at hand: this machine's, or `--bytes-per-token`) giving memory per token.
    pub fn plan(
        &self,
        device: &DeviceSpec,
        voice: &str,
        runtime: &str,
        memory: &Calibration,
        limits: &PlanLimits,
    ) -> Plan {
        if let DeviceSpec::Gpu { name, .. } = device
            && let Some((c, origin)) = self.find(voice, name, runtime)
        {
            // The device as the calibration names it, so the knee applies.
            let mut c = c.clone();
            c.device_model = device.model();
            c.source = crate::plan::CalibrationSource::Catalog;
            let mut p = plan(device, &c, limits);
            p.reason = format!(
                "calibration of {} ({}, ONNX Runtime {}): {}",
                name, origin.0, c.runtime, p.reason
            );
            return p;
        }
        let mut p = plan(device, memory, limits);
        if matches!(device, DeviceSpec::Gpu { .. }) {
            p.reason = format!(
                "memory-only rule (no calibration of {}): {}",
                device.model(),
                p.reason
            );
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::CalibrationPoint;

    /// A GPU calibration whose throughput stops rising after `knee` items.
    fn measured(model: &str, bytes_per_token: f64, knee: usize, run_s: f64) -> Calibration {
        let mut points = Vec::new();
        let mut b = 1;
        while b <= knee * 2 {
            let gain = (b.min(knee)) as f64;
            points.push(CalibrationPoint {
                batch: b,
                tokens: b * 128,
                memory_bytes: (bytes_per_token * (b * 128) as f64) as u64,
                seconds: run_s * b as f64 / gain,
                max_seconds: run_s * b as f64 / gain,
                audio_seconds: 5.0 * b as f64,
            });
            b *= 2;
        }
        let mut c = Calibration::supplied("en_US-joe-medium", bytes_per_token, 128);
        c.device_model = model.into();
        c.runtime = "1.31.1".into();
        c.points = points;
        c.source = crate::plan::CalibrationSource::Measured;
        c
    }

    /// Mixed fleet: two models with their own calibrations get their own budgets and
    /// prefetch; a third, unknown model gets the memory-only rule.
    #[test]
    fn mixed_fleet_plans_per_model_and_memory_only_for_unknown() {
        let mut cat = Catalog::default();
        cat.add(measured("NVIDIA H200", 400_000.0, 32, 0.05), "test H200");
        cat.add(measured("NVIDIA L4", 900_000.0, 8, 0.10), "test L4");
        let limits = PlanLimits::default();
        let here = Calibration::supplied("en_US-joe-medium", 700_000.0, 128);
        let h200 = DeviceSpec::simulated_gpu("NVIDIA H200", 141.0);
        let l4 = DeviceSpec::simulated_gpu("nvidia  l4", 24.0);
        let t4 = DeviceSpec::simulated_gpu("Tesla T4", 16.0);
        let voice = "en_US-joe-medium";
        let p_h200 = cat.plan(&h200, voice, "1.31.1", &here, &limits);
        let p_l4 = cat.plan(&l4, voice, "1.32.0", &here, &limits);
        let p_t4 = cat.plan(&t4, voice, "1.31.1", &here, &limits);
        assert_eq!(p_h200.batch_items, 32, "{}", p_h200.reason);
        assert_eq!(p_l4.batch_items, 8, "{}", p_l4.reason);
        assert!(
            p_h200
                .reason
                .starts_with("calibration of NVIDIA H200 (test H200")
        );
        assert!(p_l4.reason.contains("test L4"), "{}", p_l4.reason);
        assert_ne!(p_h200.max_batch_tokens, p_l4.max_batch_tokens);
        assert_ne!(p_h200.prefetch, p_l4.prefetch);
        assert!(
            p_t4.reason
                .starts_with("memory-only rule (no calibration of Tesla T4)")
        );
        assert_eq!(
            p_t4.batch_items, limits.uncurved_gpu_items,
            "{}",
            p_t4.reason
        );
    }

    #[test]
    fn later_entries_and_the_same_runtime_win() {
        let mut cat = Catalog::default();
        cat.add(measured("NVIDIA H200", 1.0, 4, 0.1), "old");
        let mut other_rt = measured("NVIDIA H200", 1.0, 4, 0.1);
        other_rt.runtime = "1.40.0".into();
        cat.add(other_rt, "newer runtime");
        cat.add(measured("NVIDIA H200", 1.0, 4, 0.1), "new");
        let v = "en_US-joe-medium";
        assert_eq!(
            cat.find(v, "NVIDIA H200", "1.31.1")
                .expect("test value")
                .1
                .0,
            "new"
        );
        assert_eq!(
            cat.find(v, "NVIDIA H200", "1.40.0")
                .expect("test value")
                .1
                .0,
            "newer runtime"
        );
        assert_eq!(
            cat.find(v, "NVIDIA H200", "9.9").expect("test value").1.0,
            "new"
        );
        assert!(cat.find("other-voice", "NVIDIA H200", "1.31.1").is_none());
    }

    #[test]
    fn files_without_a_gpu_model_or_not_json_are_refused() {
        let mut cat = Catalog::default();
        let cpu = serde_json::to_string(&Calibration::supplied("v", 1.0, 128)).expect("test value");
        let err = cat.add_json(&cpu, "cpu.json").expect_err("must fail");
        assert!(err.to_string().contains("names a GPU model"), "{err}");
        let err = cat.add_json("{}", "empty.json").expect_err("must fail");
        assert!(
            err.to_string().contains("not a narrator calibration"),
            "{err}"
        );
        let good =
            serde_json::to_string(&measured("NVIDIA H200", 1.0, 4, 0.1)).expect("test value");
        cat.add_json(&good, "h200.json").expect("test value");
        assert_eq!(cat.len(), 1);
    }

    #[test]
    fn shipped_calibrations_parse() {
        let cat = Catalog::shipped().expect("every shipped calibration parses");
        assert_eq!(cat.len(), shipped::SHIPPED.len());
    }
}
