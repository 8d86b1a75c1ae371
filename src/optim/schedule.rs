//! Learning-rate schedules.

/// Linear warm-up from 0 to `base` over `warmup` steps, then cosine decay to `min` at `total`.
/// With `total == 0` the rate stays at `base` after warm-up.
#[derive(Clone, Copy, Debug)]
pub struct LrSchedule {
    /// Peak learning rate.
    pub base: f32,
    /// Final learning rate.
    pub min: f32,
    /// Warm-up steps.
    pub warmup: u64,
    /// Total steps (end of the cosine).
    pub total: u64,
}

impl LrSchedule {
    /// The learning rate for step `t` (0-based).
    pub fn at(&self, t: u64) -> f32 {
        if t < self.warmup {
            return self.base * (t + 1) as f32 / self.warmup as f32;
        }
        if self.total <= self.warmup {
            return self.base;
        }
        let progress = ((t - self.warmup) as f32 / (self.total - self.warmup) as f32).min(1.0);
        self.min + 0.5 * (self.base - self.min) * (1.0 + (std::f32::consts::PI * progress).cos())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine() {
        let s = LrSchedule {
            base: 1.0,
            min: 0.1,
            warmup: 10,
            total: 110,
        };
        assert!((s.at(0) - 0.1).abs() < 1e-6);
        assert!((s.at(9) - 1.0).abs() < 1e-6);
        assert!((s.at(10) - 1.0).abs() < 1e-6);
        assert!((s.at(60) - 0.55).abs() < 1e-6);
        assert!((s.at(110) - 0.1).abs() < 1e-6);
        assert!((s.at(500) - 0.1).abs() < 1e-6);
    }
}
