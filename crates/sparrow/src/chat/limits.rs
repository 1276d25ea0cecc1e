//! What one render of a chat template may spend: instructions, nesting, output and heap.

use super::ChatMessage;

/// What one render of a chat template may spend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TemplateLimits {
    /// Template instructions per render. Real templates spend a few hundred per message.
    pub fuel: u64,
    /// Nesting depth of loops, conditions and macro calls (minijinja's own counter).
    pub recursion: usize,
    /// Bytes of output beyond the messages' own text (which a template may repeat a few
    /// times, see [`TemplateLimits::output_limit`]).
    pub output_bytes: usize,
    /// Bytes of heap a render may grow by beyond its output (see
    /// [`TemplateLimits::memory_limit`]): the template's working values — strings, lists,
    /// captured blocks. Real templates hold a copy or two of the chat; a string doubled in
    /// a loop reaches gigabytes in a few dozen instructions, which the fuel cannot see.
    pub memory_bytes: usize,
}

impl Default for TemplateLimits {
    /// 10 million instructions (well under a second; thousands of messages), depth 100,
    /// 1 MiB of template text, 64 MiB of working values.
    fn default() -> Self {
        TemplateLimits {
            fuel: 10_000_000,
            recursion: 100,
            output_bytes: 1 << 20,
            memory_bytes: 64 << 20,
        }
    }
}

impl TemplateLimits {
    /// The output cap for `messages`: [`Self::output_bytes`] plus four times their text (a
    /// template may quote a message more than once, e.g. a system prompt).
    pub fn output_limit(&self, messages: &[ChatMessage]) -> usize {
        let text: usize = messages
            .iter()
            .map(|m| m.content.len() + m.role.len())
            .sum();
        self.output_limit_for(text)
    }

    /// [`Self::output_limit`] for inputs of `text` bytes.
    pub fn output_limit_for(&self, text: usize) -> usize {
        self.output_bytes.saturating_add(text.saturating_mul(4))
    }

    /// The heap cap of a render whose output may reach `output_limit` bytes:
    /// [`Self::memory_bytes`] plus twice the output cap (the output buffer, which may hold
    /// twice its text while it grows).
    pub fn memory_limit(&self, output_limit: usize) -> usize {
        self.memory_bytes
            .saturating_add(output_limit.saturating_mul(2))
    }

    /// The heap cap of compiling a template of `source_len` bytes: [`Self::memory_bytes`]
    /// plus 32 bytes per byte of source (its syntax tree and instructions; constant
    /// expressions are folded at compile time, so `"x" * 99999999` is made there).
    pub fn compile_limit(&self, source_len: usize) -> usize {
        self.memory_bytes
            .saturating_add(source_len.saturating_mul(32))
    }
}
