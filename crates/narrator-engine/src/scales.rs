//! Inference scales from a voice's defaults and a user's settings: the one place where
//! `--speed`, `--length-scale`, `--noise-scale` and `--noise-w` become [`Scales`].
//!
//! Everything that makes scales goes through [`ScaleOverrides::resolve`]: `run`'s engine,
//! `submit` (whose scales are hashed into the job's identity and recorded with the job),
//! and the synthesizer (a segment whose job recorded no scales runs at its `speed`).

pub use narrator_core::Scales;

/// What a user chose over a voice's default scales; `None`: the voice's own.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ScaleOverrides {
    /// Speaking rate (`--speed`, 1.25 speaks 25 % faster): the voice's default length
    /// scale divided by it. Ignored unless finite and above 0.
    pub speed: Option<f32>,
    /// Length scale (`--length-scale`), used when no speed is given: above 1 is slower.
    pub length: Option<f32>,
    /// Noise scale (`--noise-scale`).
    pub noise: Option<f32>,
    /// Duration noise (`--noise-w`).
    pub noise_w: Option<f32>,
}

impl ScaleOverrides {
    /// The scales to synthesize with: `defaults` (the voice's,
    /// [`crate::Family::default_scales`]) with these settings over them. A speed divides
    /// the *default* length scale (`--speed` and `--length-scale` exclude each other on
    /// the command line; given both, the speed wins), so the same settings always give
    /// the same scales.
    pub fn resolve(&self, defaults: Scales) -> Scales {
        let length = match self.speed {
            Some(speed) if speed.is_finite() && speed > 0.0 => defaults.length / speed,
            _ => self.length.unwrap_or(defaults.length),
        };
        Scales {
            noise: self.noise.unwrap_or(defaults.noise),
            length,
            noise_w: self.noise_w.unwrap_or(defaults.noise_w),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VOICE: Scales = Scales {
        noise: 0.667,
        length: 1.2,
        noise_w: 0.8,
    };

    #[test]
    fn no_settings_are_the_voices_defaults() {
        assert_eq!(ScaleOverrides::default().resolve(VOICE), VOICE);
    }

    #[test]
    fn a_speed_divides_the_default_length_and_the_noises_are_taken_as_given() {
        let s = ScaleOverrides {
            speed: Some(1.5),
            noise: Some(0.3),
            noise_w: Some(0.4),
            length: None,
        }
        .resolve(VOICE);
        assert_eq!(
            s,
            Scales {
                noise: 0.3,
                length: 1.2 / 1.5,
                noise_w: 0.4
            }
        );
    }

    #[test]
    fn a_length_scale_applies_without_a_speed_and_a_speed_wins_over_it() {
        let length = |speed, length| {
            ScaleOverrides {
                speed,
                length,
                ..ScaleOverrides::default()
            }
            .resolve(VOICE)
            .length
        };
        assert_eq!(length(None, Some(0.9)), 0.9);
        assert_eq!(length(Some(2.0), Some(0.9)), 0.6);
        // A rate that is no rate leaves the length as if none was given.
        assert_eq!(length(Some(0.0), None), 1.2);
        assert_eq!(length(Some(f32::NAN), Some(0.9)), 0.9);
    }
}
