//! Progress reports on stderr for long work.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;

/// Progress of a long prefill on stderr: a bar on a terminal, otherwise a line every 4096
/// tokens (so logs of long runs show that something is happening).
pub struct PrefillProgress {
    label: String,
    bar: Option<ProgressBar>,
    last_note: usize,
    /// When the report opened: a line report's estimate of the time left.
    started: std::time::Instant,
}

impl PrefillProgress {
    /// A progress report labelled `label`.
    pub fn new(label: &str) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new(0);
            b.set_style(
                ProgressStyle::with_template(&format!(
                    "{label} {{bar:40}} {{pos}}/{{len}} tokens ({{per_sec}}, eta {{eta}})"
                ))
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b
        });
        PrefillProgress {
            label: label.to_string(),
            bar,
            last_note: 0,
            started: std::time::Instant::now(),
        }
    }

    /// `done` of `total` tokens processed.
    pub fn update(&mut self, done: usize, total: usize) {
        match &self.bar {
            Some(b) => {
                b.set_length(total as u64);
                b.set_position(done as u64);
            }
            None if done == total || done >= self.last_note + 4096 => {
                let spent = self.started.elapsed().as_secs_f64();
                match eta_seconds(spent, done, total) {
                    Some(eta) => eprintln!(
                        "{}: {done}/{total} tokens ({spent:.0} s, eta {eta:.0} s)",
                        self.label
                    ),
                    None => eprintln!("{}: {done}/{total} tokens ({spent:.0} s)", self.label),
                }
                self.last_note = done;
            }
            None => {}
        }
    }

    /// Clear the bar (a line report needs no closing).
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// Seconds left at the pace so far (`spent` seconds for `done` of `total`), once there is
/// a pace to go by and work left.
fn eta_seconds(spent: f64, done: usize, total: usize) -> Option<f64> {
    (done > 0 && done < total).then(|| spent / done as f64 * (total - done) as f64)
}

/// Progress of a run of labelled prefills (one per prefill policy of an evaluation): a
/// report opens when a label's first batch arrives and closes at its last, so each
/// prefill gets its own bar or lines.
#[derive(Default)]
pub struct PrefillsProgress {
    current: Option<PrefillProgress>,
}

impl PrefillsProgress {
    /// `done` of `total` tokens of the prefill labelled `label`.
    pub fn update(&mut self, label: &str, done: usize, total: usize) {
        let p = self
            .current
            .get_or_insert_with(|| PrefillProgress::new(label));
        p.update(done, total);
        if done == total {
            p.finish();
            self.current = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::eta_seconds;

    #[test]
    fn eta_follows_the_pace_so_far() {
        assert_eq!(eta_seconds(10.0, 1000, 4000), Some(30.0));
        assert_eq!(eta_seconds(5.0, 0, 4000), None);
        assert_eq!(eta_seconds(5.0, 4000, 4000), None);
    }
}
