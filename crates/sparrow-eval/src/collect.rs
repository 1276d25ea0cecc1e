//! Recording a training context: the model runs over a span of text with exact attention,
//! a recording policy keeps the (de-roped) query rows of sampled positions as each layer
//! plans its reads, and at the end every cached key is read back and de-roped.

use crate::text::{read_text, text_files};
use sparrow::attention::{PlanContext, ReadPlan, SparsePolicy};
use sparrow::kv::KvType;
use sparrow::kv::StoreLayer;
use sparrow::model::rope::Rope;
use sparrow::model::{Logits, Model};
use sparrow::saap::record::{ContextRecord, RecordMeta, RopeParams};
use sparrow::tokenizer::Tokenizer;
use sparrow::{Error, Result};
use sparrow_attn::kernel::read_f32;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Which positions' queries are recorded, and how the context is run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectSettings {
    /// The first position whose query is recorded: a query needs a long past to be a
    /// long-range one (the trainer keeps those whose best key is far back).
    pub first_query: usize,
    /// Every `query_stride`-th position from `first_query` on is recorded.
    pub query_stride: usize,
    /// Prefill batch size.
    pub batch: usize,
}

impl Default for CollectSettings {
    fn default() -> Self {
        CollectSettings {
            first_query: 1024,
            query_stride: 8,
            batch: 512,
        }
    }
}

/// Per layer: the de-roped query rows recorded so far.
type Recorded = Arc<Mutex<Vec<Vec<f32>>>>;

/// Exact attention that records the query rows of the positions `wanted` says.
struct QueryRecorder {
    rows: Recorded,
    rope: Rope,
    head_dim: usize,
    wanted: CollectSettings,
}

impl QueryRecorder {
    fn wants(&self, pos: usize) -> bool {
        pos >= self.wanted.first_query
            && (pos - self.wanted.first_query).is_multiple_of(self.wanted.query_stride)
    }
}

impl SparsePolicy for QueryRecorder {
    fn name(&self) -> &str {
        "full"
    }

    fn plan<'p>(&'p mut self, ctx: &PlanContext<'_>) -> ReadPlan<'p> {
        let q_dim = ctx.shape.q_dim();
        let mut rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        for (i, q) in ctx.q.chunks_exact(q_dim).enumerate() {
            let pos = ctx.pos0 + i;
            if self.wants(pos) {
                let at = rows[ctx.layer].len();
                rows[ctx.layer].extend_from_slice(q);
                self.rope
                    .unrotate(&mut rows[ctx.layer][at..], self.head_dim, pos);
            }
        }
        ReadPlan::causal(ctx.shape, ctx.pos0, ctx.n_tokens())
    }
}

/// Run `tokens` through `model` and record them (`source` says where they came from),
/// calling `progress(done, total)` after each batch.
pub fn collect_context(
    model: &Model,
    tokens: &[u32],
    settings: &CollectSettings,
    source: String,
    mut progress: impl FnMut(usize, usize),
) -> Result<ContextRecord> {
    let c = &model.config;
    let n = tokens.len();
    if c.has_sliding_layers() {
        return Err(Error::Unsupported(format!(
            "Saap on a {} model: its sliding-window layers keep only their window, and \
             recording all their keys is not supported",
            c.arch.name()
        )));
    }
    if settings.query_stride == 0 || settings.batch == 0 || settings.first_query == 0 {
        return Err(Error::Other(
            "query stride, batch size and first query position must be at least 1".into(),
        ));
    }
    if n <= settings.first_query {
        return Err(Error::Other(format!(
            "a training context of {n} tokens has no query past position {}",
            settings.first_query
        )));
    }
    let rope = Rope::of(c);
    let rows: Recorded = Arc::new(Mutex::new(vec![Vec::new(); c.n_layer]));
    // F32 keys: what the trainer sees is what the model computed, not its f16 rounding.
    let mut state = model.new_state(n, KvType::F32)?;
    state.set_attention(Box::new(QueryRecorder {
        rows: rows.clone(),
        rope,
        head_dim: c.head_dim,
        wanted: settings.clone(),
    }));
    progress(0, n);
    for start in (0..n).step_by(settings.batch) {
        let end = (start + settings.batch).min(n);
        model.forward(&mut state, &tokens[start..end], Logits::None)?;
        progress(end, n);
    }
    let queries = std::mem::take(&mut *rows.lock().unwrap_or_else(|e| e.into_inner()));
    let kv_dim = c.kv_dim();
    let mut keys = Vec::with_capacity(c.n_layer);
    for layer in 0..c.n_layer {
        let mut k = vec![0f32; n * kv_dim];
        read_f32(
            &StoreLayer {
                store: state.kv(),
                layer,
            },
            false,
            c.head_dim,
            0,
            &mut k,
        );
        for (pos, row) in k.chunks_exact_mut(kv_dim).enumerate() {
            rope.unrotate(row, c.head_dim, pos);
        }
        keys.push(k);
    }
    let query_positions: Vec<usize> = (settings.first_query..n)
        .step_by(settings.query_stride)
        .collect();
    Ok(ContextRecord {
        meta: RecordMeta {
            n_layer: c.n_layer,
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            n_tokens: n,
            query_positions,
            rope: RopeParams::of(c),
            source,
        },
        fingerprint: c.fingerprint,
        keys,
        queries,
    })
}

/// A training context: where it came from and its tokens.
pub type TextContext = (String, Vec<u32>);

/// Up to `count` contexts of `n` tokens from the `.txt` files of `dir` (file-name order):
/// consecutive chunks of each file, the files taken in turn (chunk 0 of every file, then
/// chunk 1, …) so that a few contexts already span several texts. Each context starts with
/// the model's BOS token when it uses one, like a real prompt, so position 0 is the sink
/// it would be. Fewer than `count` when the texts run out; an error when there is none.
pub fn text_contexts(
    tokenizer: &Tokenizer,
    dir: &Path,
    n: usize,
    count: usize,
) -> Result<Vec<TextContext>> {
    let files = text_files(dir)?;
    let bos = tokenizer.encode("", true, false);
    let body = n
        .checked_sub(bos.len())
        .filter(|&b| b > 0)
        .ok_or_else(|| Error::Other(format!("a training context of {n} tokens is too short")))?;
    // Chunks wanted per file, and the text needed for them (~4 bytes per token; more is
    // read if that falls short).
    let per_file = count.div_ceil(files.len());
    let mut chunks: Vec<Vec<TextContext>> = Vec::new();
    for f in &files {
        let text = read_text(f)?;
        let mut bytes = (per_file * body * 5).max(4096);
        let ids = loop {
            let mut end = bytes.min(text.len());
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            let ids = tokenizer.encode(&text[..end], false, false);
            if ids.len() >= per_file * body || end == text.len() {
                break ids;
            }
            bytes *= 2;
        };
        let name = f
            .file_name()
            .map_or(String::new(), |s| s.to_string_lossy().into_owned());
        chunks.push(
            ids.chunks_exact(body)
                .take(per_file)
                .enumerate()
                .map(|(j, c)| {
                    let mut t = bos.clone();
                    t.extend_from_slice(c);
                    (format!("{name} tokens {}..{}", j * body, (j + 1) * body), t)
                })
                .collect(),
        );
    }
    let mut out = Vec::with_capacity(count);
    for j in 0..per_file {
        for file in &chunks {
            if out.len() < count {
                if let Some(c) = file.get(j) {
                    out.push(c.clone());
                }
            }
        }
    }
    if out.is_empty() {
        return Err(Error::Other(format!(
            "the texts in {} are shorter than one context of {n} tokens",
            dir.display()
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sparrow::synthetic::{synthetic_model, SyntheticSpec};

    /// The record holds what the model computed: rotating a recorded key and query again
    /// gives the cached key and a query whose exact attention output (computed here in
    /// f64 from the record) equals the engine's at that position. The file round-trips
    /// and refuses a flipped bit.
    #[test]
    fn records_de_roped_keys_and_queries_that_rotate_back() {
        let m = synthetic_model(&SyntheticSpec::default()).unwrap();
        let c = &m.config;
        let tokens: Vec<u32> = (0..40).map(|i| (i * 7 % c.vocab_size) as u32).collect();
        let s = CollectSettings {
            first_query: 20,
            query_stride: 3,
            batch: 7,
        };
        let rec = collect_context(&m, &tokens, &s, "test".into(), |_, _| {}).unwrap();
        assert_eq!(rec.meta.query_positions, vec![20, 23, 26, 29, 32, 35, 38]);
        assert_eq!(rec.queries[0].len(), 7 * c.q_dim());
        // Keys rotate back to the cache's.
        let mut state = m.new_state(40, KvType::F32).unwrap();
        m.forward(&mut state, &tokens, Logits::None).unwrap();
        let rope = Rope::of(c);
        for layer in 0..c.n_layer {
            let mut cached = vec![0f32; 40 * c.kv_dim()];
            read_f32(
                &StoreLayer {
                    store: state.kv(),
                    layer,
                },
                false,
                c.head_dim,
                0,
                &mut cached,
            );
            for pos in [0, 13, 39] {
                let mut k = rec.keys[layer][pos * c.kv_dim()..][..c.kv_dim()].to_vec();
                rope.rotate(&mut k, c.head_dim, pos);
                for (a, b) in k.iter().zip(&cached[pos * c.kv_dim()..]) {
                    assert!((a - b).abs() < 1e-4, "layer {layer} pos {pos}");
                }
            }
        }
        let bytes = rec.encode();
        assert_eq!(ContextRecord::decode(&bytes).unwrap(), rec);
        let mut bad = bytes.clone();
        bad[bytes.len() / 2] ^= 4;
        assert!(matches!(
            ContextRecord::decode(&bad),
            Err(sparrow::saap::RecordError::Checksum)
        ));
        assert!(ContextRecord::decode(&bytes[..bytes.len() - 1]).is_err());
    }
}
