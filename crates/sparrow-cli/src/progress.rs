//! Progress reports on stderr for long work.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;

/// Progress of a long prefill on stderr: a bar on a terminal, otherwise a line every 4096
/// tokens (so logs of long runs show that something is happening).
pub struct PrefillProgress {
    label: String,
    bar: Option<ProgressBar>,
    last_note: usize,
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
                eprintln!("{}: {done}/{total} tokens", self.label);
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
