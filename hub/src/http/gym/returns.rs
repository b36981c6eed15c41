//! The rewards an environment earned, as this hub process saw them: the
//! running episode's return and the last [`KEPT`] finished episodes', so a
//! person can watch a run (`GET /gym/v1/envs`, the console's Gym view).
//! Kept in memory only: a restart, or another replica's steps, start it
//! afresh; the trainer's own log is the record.

use std::collections::VecDeque;

use serde::Serialize;

/// Finished episodes kept per environment.
pub const KEPT: usize = 200;

/// One finished (or abandoned, by a reset mid-episode) episode.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct EpisodeReturn {
    pub episode: u32,
    pub steps: u32,
    /// The sum of its steps' rewards.
    #[serde(rename = "return")]
    pub total: f64,
}

#[derive(Debug, Clone, Default)]
pub struct Returns {
    /// The running episode's return so far.
    pub current: f64,
    /// Whether the running episode has steps not yet recorded.
    open: bool,
    pub finished: VecDeque<EpisodeReturn>,
}

impl Returns {
    /// A step of `episode` (its `steps`th) earned `reward`; `ending` closes it.
    pub fn step(&mut self, episode: u32, steps: u32, reward: f64, ending: bool) {
        // A matcher's weight is the operator's number, but never let a NaN
        // or an infinity poison every later sum.
        if reward.is_finite() {
            self.current += reward;
        }
        self.open = true;
        if ending {
            self.close(episode, steps);
        }
    }

    /// Records the running episode (a reset ends it, finished or not).
    pub fn close(&mut self, episode: u32, steps: u32) {
        if self.open {
            if self.finished.len() == KEPT {
                self.finished.pop_front();
            }
            self.finished.push_back(EpisodeReturn {
                episode,
                steps,
                total: self.current,
            });
        }
        self.open = false;
        self.current = 0.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn episodes_are_summed_recorded_once_and_bounded() {
        let mut r = Returns::default();
        r.step(1, 1, 0.5, false);
        r.step(1, 2, 1.0, true);
        assert_eq!(r.current, 0.0);
        r.close(1, 2); // the reset after an ending adds nothing
        r.step(2, 1, 2.0, false);
        r.step(2, 2, f64::NAN, false);
        assert_eq!(r.current, 2.0);
        r.close(2, 2); // a reset mid-episode records it
        let got: Vec<_> = r
            .finished
            .iter()
            .map(|e| (e.episode, e.steps, e.total))
            .collect();
        assert_eq!(got, vec![(1, 2, 1.5), (2, 2, 2.0)]);
        for n in 0..(KEPT as u32 + 10) {
            r.step(n, 1, 1.0, true);
        }
        assert_eq!(r.finished.len(), KEPT);
    }
}
