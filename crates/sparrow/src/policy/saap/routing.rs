//! One decode step's routing for one KV head's query group: rank buckets (the trained
//! Q-model, the centroids, or the hedged mix) or cells, take the top ones that fit the
//! budget, and turn them into the ranges the step reads.

use super::lists::{CellLists, CellPositions, Lists};
use super::settings::{Layout, SaapSettings, MIN_RANKED_CELLS, RANKED, SINKS};
use crate::saap::index::{prior_scale, HeadModel, RouterCopy, RouterWeights, Scratch};
use sparrow_attn::kernel::{runs, union, KvSource, Level};
use std::ops::Range;

/// Scratch of one KV head's routing, kept between calls.
/// What one KV head's routing for one decode step reads: the settings, the head's trained
/// model and the router weights to read, its lists, where the window starts (`end`) and how
/// many positions the step sees (`n`).
#[derive(Clone, Copy)]
pub(super) struct Step<'a> {
    pub(super) settings: &'a SaapSettings,
    pub(super) model: &'a HeadModel,
    pub(super) weights: RouterWeights<'a>,
    pub(super) lists: &'a Lists,
    pub(super) end: usize,
    pub(super) n: usize,
    /// The layer's store and this KV head: a store that keeps the layer by bucket serves the
    /// chosen entries as runs of its slots.
    pub(super) store: &'a dyn KvSource,
    /// Whether `store` keeps the layer by bucket (the policy's [`Layout::Buckets`], honoured).
    pub(super) by_bin: bool,
    pub(super) kv_head: usize,
}

#[derive(Clone, Default)]
pub(super) struct HeadWork {
    /// The group's de-roped query rows.
    pub(super) queries: Vec<f32>,
    pub(super) scratch: Scratch,
    /// Router mass per bucket.
    pub(super) mass: Vec<f32>,
    /// With [`SaapSettings::oracle`]: each position's exact attention mass for the group.
    pub(super) key_mass: Vec<f64>,
    /// Bucket ids, most mass first once ranked.
    pub(super) order: Vec<u32>,
    /// With [`Router::Cells`](super::Router::Cells): the group's RoPE'd query rows summed.
    pub(super) query_sum: Vec<f32>,
    /// Scratch of the cells' products.
    pub(super) cell_dots: Vec<f32>,
    /// The cells' scores as [`rank_key`](sparrow_attn::policy::rank_key)s, ranked.
    pub(super) cell_ranks: Vec<u64>,
    /// What the step reads beside the sink and window: per chosen bucket or cell (its id
    /// with [`Router::Cells`](super::Router::Cells), else the bucket's), the range of its
    /// bucket's entries.
    pub(super) picks: Vec<(u32, Range<usize>)>,
    /// With [`Router::Cells`](super::Router::Cells): the segment the window starts in,
    /// sorted by bucket this step.
    pub(super) window_segment: CellPositions,
    /// With a halo (`--saap-halo`): the longest keys of the chosen cells whose key holds at
    /// least half the cell's estimated mass, around which the step reads more.
    pub(super) halos: Vec<usize>,
    /// One bit per cell chosen this step (a halo reads only positions of cells not chosen).
    pub(super) chosen: Vec<u64>,
    /// One bit per position read: the chosen buckets' positions, the sink and the window,
    /// turned into ascending ranges without sorting positions.
    pub(super) marks: Vec<u64>,
}

/// What a KV head's group reads: ascending disjoint ranges of store positions, and of the
/// store's slots where it keeps the layer by bucket (empty otherwise).
pub(super) struct HeadReads {
    pub(super) store: Vec<Range<usize>>,
    pub(super) slots: Vec<Range<usize>>,
}

impl HeadWork {
    /// What the group of a KV head reads for a step that sees `n` positions, the window
    /// starting at `end`: the sink, the buckets `model` ranks first for the de-roped query
    /// rows in `self.queries` (their positions from the sink on and below `end`, listed in
    /// `lists`) and the window. Where every bucket is chosen, everything is read from the
    /// store in order (exactly full attention).
    pub(super) fn reads(&mut self, step: &Step<'_>) -> HeadReads {
        let Step {
            settings,
            lists,
            end,
            n,
            store,
            kv_head,
            ..
        } = *step;
        let chosen = self.choose(step);
        if chosen == end.saturating_sub(SINKS) {
            return HeadReads {
                store: std::iter::once(0..n).collect(),
                slots: Vec::new(),
            };
        }
        let dense = || (0..SINKS.min(n)).chain(end..n);
        // The entries the store keeps by bucket are read as its slots (they are this
        // policy's lists: the store placed each block where the policy said); the rest —
        // the open segment's, or all under a store kept by position — by position.
        let mut slots = Vec::new();
        self.marks.clear();
        self.marks.resize(n.div_ceil(64), 0);
        let mut mark = |p: usize| self.marks[p / 64] |= 1 << (p % 64);
        let serve = |b: usize, entries: &Range<usize>, slots: &mut Vec<Range<usize>>| match settings
            .layout
        {
            Layout::Buckets => store.bin_slots(kv_head, b, entries.clone(), slots),
            Layout::Positions => 0,
        };
        match &lists.cells {
            None => {
                for (b, entries) in &self.picks {
                    let served = serve(*b as usize, entries, &mut slots);
                    lists.buckets[*b as usize][entries.start + served..entries.end]
                        .iter()
                        .for_each(|&p| mark(p as usize));
                }
            }
            Some(cells) => {
                for (cell, entries) in &self.picks {
                    let (s, b) = cells.stats.cell(*cell);
                    let served = if step.by_bin {
                        serve(b, entries, &mut slots)
                    } else {
                        0
                    };
                    let rest = served..entries.len();
                    if rest.is_empty() {
                        continue;
                    }
                    // Not served: the window's segment (sorted this step), or a complete
                    // one sorted by the policy where the store keeps positions.
                    if self.window_segment.segment == Some(s) {
                        self.window_segment.of(b)[rest]
                            .iter()
                            .for_each(|&p| mark(p as usize));
                    } else {
                        cells
                            .sorted_cell(s, b)
                            .skip(rest.start)
                            .take(rest.len())
                            .for_each(&mut mark);
                    }
                }
            }
        }
        if let Some(cells) = lists.cells.as_ref().filter(|_| !self.halos.is_empty()) {
            let (stats, halo) = (&cells.stats, settings.halo);
            let (seg, c) = (stats.segment(), stats.clusters());
            self.chosen.clear();
            self.chosen.resize((stats.segments() * c).div_ceil(64), 0);
            for &(cell, _) in &self.picks {
                self.chosen[cell as usize / 64] |= 1 << (cell % 64);
            }
            // A position of a chosen cell is read already (all of its cell's entries below
            // `end` are); the others in a halo are read by position.
            let before = halo / 4;
            for &at in &self.halos {
                let from = at.saturating_sub(before).max(SINKS);
                for p in from..(at + halo - before).min(end) {
                    let cell = p / seg * c + cells.bucket_of[p] as usize;
                    if self.chosen[cell / 64] & (1 << (cell % 64)) == 0 {
                        mark(p);
                    }
                }
            }
        }
        dense().for_each(&mut mark);
        HeadReads {
            store: runs(set_bits(&self.marks)),
            slots: union(slots),
        }
    }

    /// Leaves in `self.picks` what the step reads beside the sink and window (whole buckets,
    /// or cells with [`Router::Cells`](super::Router::Cells)); returns how many positions
    /// that is.
    fn choose(&mut self, step: &Step<'_>) -> usize {
        let Step {
            settings,
            model,
            lists,
            end,
            n,
            ..
        } = *step;
        self.picks.clear();
        if let Some(cells) = &lists.cells {
            // The group's mean logit: the summed query over the group size and √head_dim.
            let group = self.queries.len() / self.query_sum.len().max(1);
            let scale = prior_scale(model.head_dim()) / group.max(1) as f32;
            let target = budget_target(settings, end, n);
            return self.choose_cells(cells, scale, end, target, settings.halo);
        }
        let got = self.choose_buckets(step);
        let buckets = &lists.buckets;
        self.picks.extend(
            self.order
                .iter()
                .map(|&b| (b, readable(&buckets[b as usize], end))),
        );
        got
    }

    /// Scores every cell of the segments below `end` for the group's summed query and picks
    /// the top ones that fit in `target` positions (at least one), each cell's entries in
    /// its bucket from the sink on and below `end`; returns how many positions they hold.
    /// With `halo > 0`, a chosen cell whose longest key (below `end`) holds at least half
    /// its estimated mass counts `halo` positions more against `target`, and that key is
    /// left in `self.halos`.
    fn choose_cells(
        &mut self,
        lists: &CellLists,
        scale: f32,
        end: usize,
        target: usize,
        halo: usize,
    ) -> usize {
        self.halos.clear();
        // Everything fits (a halo's cost aside): read it all, exactly.
        if target >= end.saturating_sub(SINKS) {
            return end.saturating_sub(SINKS);
        }
        let cells = &lists.stats;
        // The segment the window starts in: its entries below `end` are found by sorting
        // its positions below `end` by bucket (the segments below it are whole, and their
        // cells' counts hold them all).
        let seg = cells.segment();
        self.window_segment.segment = None;
        if !end.is_multiple_of(seg) {
            let s = end / seg;
            let from = (s * seg).max(SINKS).min(end);
            self.window_segment
                .sort(s, from, end, &lists.bucket_of, cells.clusters());
        }
        let (q, dots, ranks) = (&self.query_sum, &mut self.cell_dots, &mut self.cell_ranks);
        // One key per cell, highest score first once sorted (NaN, a broken activation, with
        // −∞; the empty cells after every other): a step ranks thousands of cells per layer
        // and KV head, as integers.
        let live = cells.score(q, scale, end, dots, ranks);
        // Rank only as far as the budget usually reaches — twice the cells of an average
        // size it holds — and the rest only if all of those fit.
        let average = end.max(1) as f64 / live.max(1) as f64;
        let reach = (2.0 * target as f64 / average) as usize;
        let mut sorted = ranks.len().min(reach.max(MIN_RANKED_CELLS));
        if sorted < ranks.len() {
            ranks.select_nth_unstable(sorted - 1);
        }
        ranks[..sorted].sort_unstable();
        // Each cell's log-mass and `q · longest`, by cell index (`score` leaves them there).
        let (log_mass, longest_dots) = self.cell_dots.split_at(self.cell_dots.len() / 2);
        let (mut got, mut cost) = (0, 0);
        let mut take = 0;
        while take < live {
            if take == sorted {
                ranks[sorted..].sort_unstable();
                sorted = ranks.len();
            }
            let cell = ranks[take] as u32;
            let (s, b) = cells.cell(cell);
            // The cell's entries in its bucket, from its counts; in the window's segment,
            // only those below `end`.
            let entries = cells.entries(cell);
            let len = if self.window_segment.segment == Some(s) {
                self.window_segment.count(b)
            } else {
                entries.len()
            };
            let at = cells.longest_at(cell);
            let sharp = halo > 0
                && len > 0
                && at < end
                && scale * longest_dots[cell as usize]
                    >= log_mass[cell as usize] - std::f32::consts::LN_2;
            let extra = if sharp { halo } else { 0 };
            if take > 0 && cost + len + extra > target {
                break;
            }
            if len > 0 {
                self.picks.push((cell, entries.start..entries.start + len));
            }
            if sharp {
                self.halos.push(at);
            }
            got += len;
            cost += len + extra;
            take += 1;
        }
        got
    }

    /// Ranks the buckets by `model`'s router (reading `weights`) for the query rows in
    /// `self.queries` and leaves in `self.order` those the step reads (a fixed count, or the
    /// top ones that fit the budget); returns how many positions they hold below `end`.
    fn choose_buckets(&mut self, step: &Step<'_>) -> usize {
        let Step {
            settings,
            model,
            weights,
            lists,
            end,
            n,
            ..
        } = *step;
        let c = model.clusters();
        self.mass.clear();
        self.mass.resize(c, 0.0);
        let (q, scratch, mass) = (&self.queries, &mut self.scratch, &mut self.mass);
        if settings.oracle {
            for (m, list) in mass.iter_mut().zip(&lists.buckets) {
                let keys = &list[readable(list, end)];
                *m = keys.iter().map(|&p| self.key_mass[p as usize]).sum::<f64>() as f32;
            }
        } else {
            model.add_mass(settings.router, weights, Level::active(), q, scratch, mass);
        }
        let size = |b: u32| readable(&lists.buckets[b as usize], end).len();
        let mass = &self.mass;
        // Most mass first; NaN (a broken activation) ranks last.
        let key = |b: u32| {
            let m = mass[b as usize];
            if m.is_nan() {
                f32::NEG_INFINITY
            } else {
                m
            }
        };
        self.order.clear();
        self.order.extend(0..c as u32);
        if let Some(probes) = settings.probes {
            let probes = probes.min(c);
            if probes < c {
                self.order
                    .select_nth_unstable_by(probes - 1, |&a, &b| key(b).total_cmp(&key(a)));
                self.order.truncate(probes);
            }
            return self.order.iter().map(|&b| size(b)).sum();
        }
        let target = budget_target(settings, end, n);
        // Rank only as far as a budget usually reaches: the top `RANKED` first, the rest
        // only if all of those fit.
        let by_mass = |a: &u32, b: &u32| key(*b).total_cmp(&key(*a));
        let mut sorted = c.min(RANKED);
        if sorted < c {
            self.order.select_nth_unstable_by(sorted - 1, by_mass);
        }
        self.order[..sorted].sort_unstable_by(by_mass);
        // The top buckets that fit (at least one).
        let (mut got, mut take) = (0, 0);
        while take < c {
            if take == sorted {
                self.order[sorted..].sort_unstable_by(by_mass);
                sorted = c;
            }
            let len = size(self.order[take]);
            if take > 0 && got + len > target {
                break;
            }
            got += len;
            take += 1;
        }
        self.order.truncate(take);
        got
    }
}

/// Positions a step that sees `n` may read beyond the sink and the window (which starts at
/// `end`): its read limit less that dense part.
pub(super) fn budget_target(settings: &SaapSettings, end: usize, n: usize) -> usize {
    let dense = SINKS + (n - end);
    settings.read_limit(n).saturating_sub(dense)
}

/// The router matrices of head `i` (layer-major), `model`: its Q8_0 copy if `copies` holds
/// one, else the index's f32 ones.
pub(super) fn router_weights<'a>(
    copies: &'a [RouterCopy],
    model: &'a HeadModel,
    i: usize,
) -> RouterWeights<'a> {
    match copies.get(i) {
        Some(copy) => copy.weights(model),
        None => model.weights(),
    }
}

/// The entries of a bucket's `list` (ascending positions) from the sinks on and below
/// `end`.
pub(super) fn readable(list: &[u32], end: usize) -> Range<usize> {
    let from = list.partition_point(|&p| (p as usize) < SINKS);
    from..list.partition_point(|&p| (p as usize) < end).max(from)
}

/// The positions of the set bits of `marks` (bit `p % 64` of word `p / 64`), ascending.
pub(super) fn set_bits(marks: &[u64]) -> impl Iterator<Item = usize> + '_ {
    marks.iter().enumerate().flat_map(|(i, &word)| {
        let mut w = word;
        std::iter::from_fn(move || {
            (w != 0).then(|| {
                let bit = w.trailing_zeros() as usize;
                w &= w - 1;
                i * 64 + bit
            })
        })
    })
}
