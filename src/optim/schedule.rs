//! Learning-rate schedules.

/// Linear warm-up from 0 to `base` over `warmup` steps, then cosine decay to `min` at `total`.
/// With `total == 0` the rate stays at `base` after warm-up.
///
/// ```
/// use wgrad::optim::LrSchedule;
/// let s = LrSchedule { base: 1e-3, min: 1e-4, warmup: 10, total: 110 };
/// let close = |a: f32, b: f32| (a - b).abs() < 1e-8;
/// assert!(close(s.at(4), 5e-4)); // half-way through the warm-up
/// assert!(close(s.at(10), 1e-3)); // the peak
/// assert!(close(s.at(60), 5.5e-4)); // half-way down the cosine
/// assert!(close(s.at(500), 1e-4)); // the floor, from `total` on
/// // In a training loop: opt.set_lr(s.at(step)) before each step.
/// ```
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
