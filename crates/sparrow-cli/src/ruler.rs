//! `sparrow eval ruler`: RULER's synthetic tasks over lengths × tasks × seeded cases, every
//! policy of `--attn` answering each case from one prefill per prefill policy. Prints a
//! table per policy (task × length), a table per length (policy × task family), writes
//! every result as JSON after each case (`--resume` skips the cases already there) and a
//! PNG of average score against length per policy.

use super::score_plot::{self, Series};
use crate::progress::PrefillsProgress;
use crate::run::init_threads;
use crate::{KvArgs, ModelArgs};
use sparrow::attention::AttentionChoice;
use sparrow::policy::{
    H2oSettings, OracleSettings, QuestSettings, SaapSettings, SketchSettings, StreamingAttention,
};
use sparrow_eval::answer::RunSettings;
use sparrow_eval::ruler::{build_case, run_case, CaseResult, Corpus, Family, Task};
use sparrow_eval::text::load_haystack;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `sparrow eval ruler`.
#[derive(clap::Args, Debug)]
pub struct RulerArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Policies to measure: `--attn full,quest,saap`; `PREFILL+DECODE` names a pair
    /// (`xattention+quest`). Decode policies share one prefill per case.
    #[command(flatten)]
    kv: KvArgs,
    /// Folder of .txt files: the prose haystack and the words the tasks draw from.
    #[arg(long = "haystack")]
    haystack: PathBuf,
    /// Case lengths in tokens of the model's tokenizer, prompt and answer budget together
    /// (comma-separated).
    #[arg(long = "lengths", value_delimiter = ',', default_value = "4096,8192")]
    lengths: Vec<usize>,
    /// Tasks (comma-separated RULER names, or `all`): niah_single_1..3, niah_multikey_1..3,
    /// niah_multivalue, niah_multiquery, vt, cwe, fwe.
    #[arg(long = "tasks", value_delimiter = ',', default_value = "all")]
    tasks: Vec<String>,
    /// Seeded cases per task and length.
    #[arg(long = "cases", default_value_t = 2)]
    cases: usize,
    /// Seed of the cases (each case draws its own from it).
    #[arg(long = "seed", default_value_t = 1)]
    seed: u64,
    /// Write every result as JSON to this file, rewritten after each case.
    #[arg(long = "json")]
    json: Option<PathBuf>,
    /// Keep the results already in --json and run only the cases missing there (a long grid
    /// stopped part way resumes where it stopped).
    #[arg(long = "resume", requires = "json")]
    resume: bool,
    /// Draw average score against length, one line per policy, as a PNG to this file.
    #[arg(long = "plot")]
    plot: Option<PathBuf>,
    /// Set every selection policy's read budget to this share of each case's length, so
    /// policies compare at equal reads at every length: Quest's, the sketch's and the
    /// oracle's budgets and the streaming window (sinks included) to ⌈F·L⌉ positions, H2O's
    /// heavy and recent shares to F/2 each, Saap's budget to F (its `--saap-max-read` raised
    /// to ⌈F·L⌉ if lower). Without it, each policy's own flags apply at every length.
    #[arg(long = "read-share")]
    read_share: Option<f64>,
    /// Threads (default: all available cores).
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
    /// Prompt tokens per forward pass.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    batch_size: usize,
    #[command(flatten)]
    prefill_cache: super::PrefillCacheArgs,
}

/// The tasks `names` stand for (`all`: every task), or why not.
fn tasks(names: &[String]) -> Result<Vec<Task>, String> {
    if names.iter().any(|n| n == "all") {
        return Ok(Task::ALL.to_vec());
    }
    let mut out = Vec::new();
    for n in names {
        let t = Task::named(n.trim())?;
        if !out.contains(&t) {
            out.push(t);
        }
    }
    Ok(out)
}

pub fn ruler(a: RulerArgs) -> Result<(), String> {
    let tasks = tasks(&a.tasks)?;
    if a.cases == 0 {
        return Err("--cases must be at least 1".into());
    }
    if let Some(&l) = a.lengths.iter().find(|&&l| l < 512) {
        return Err(format!("--lengths: {l} is too short (at least 512 tokens)"));
    }
    if let Some(f) = a.read_share {
        if !(f > 0.0 && f <= 1.0) {
            return Err(format!("--read-share {f} is outside (0, 1]"));
        }
    }
    let choices = a.kv.choices()?;
    let labels: Vec<String> = choices.iter().map(|c| c.label()).collect();
    let settings = RunSettings {
        kv: a.kv.options(),
        batch_size: a.batch_size,
        prefill_cache: a.prefill_cache.open()?,
    };
    let mut results: Vec<CaseResult> = match (&a.json, a.resume) {
        (Some(path), true) if path.exists() => read_results(path)?,
        _ => Vec::new(),
    };
    init_threads(a.threads)?;
    let corpus = Corpus::new(&load_haystack(&a.haystack).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let engine = a.model.load_engine()?;
    let trained = engine.model.config.n_ctx_train;
    if let Some(&l) = a.lengths.iter().find(|&&l| l > trained) {
        eprintln!("warning: length {l} is beyond the model's trained context of {trained}");
    }
    let total = a.lengths.len() * tasks.len() * a.cases;
    let mut n = 0;
    for &length in &a.lengths {
        let choices: Vec<AttentionChoice> = match a.read_share {
            Some(f) => choices
                .iter()
                .map(|c| at_read_share(c, f, length))
                .collect(),
            None => choices.clone(),
        };
        for &task in &tasks {
            for index in 0..a.cases {
                n += 1;
                let done = |r: &CaseResult, label: &str| {
                    r.task == task && r.length == length && r.index == index && r.attention == label
                };
                if labels.iter().all(|l| results.iter().any(|r| done(r, l))) {
                    eprintln!(
                        "[{n}/{total}] {} {length} #{index}: in the JSON already",
                        task.name()
                    );
                    continue;
                }
                let started = Instant::now();
                let case = build_case(&engine, &corpus, task, length, index, a.seed)
                    .map_err(|e| e.to_string())?;
                let mut progress = PrefillsProgress::default();
                let case_results = run_case(
                    &engine,
                    &case,
                    &settings,
                    &choices,
                    &mut |label: &str, done, all| progress.update(label, done, all),
                )
                .map_err(|e| e.to_string())?;
                let scores: Vec<String> = case_results
                    .iter()
                    .map(|r| format!("{} {:.0}", r.attention, r.score * 100.0))
                    .collect();
                // Each prefill group reports its one prefill's time on every member.
                let mut prefills: Vec<(f64, bool)> = case_results
                    .iter()
                    .map(|r| (r.prefill_seconds, r.prefill_cached))
                    .collect();
                prefills.dedup();
                let prefill: f64 = prefills.iter().map(|p| p.0).sum();
                let cached = match prefills.iter().filter(|p| p.1).count() {
                    0 => String::new(),
                    k if k == prefills.len() => " (read from the prefill cache)".to_string(),
                    k => format!(" ({k} of {} read from the prefill cache)", prefills.len()),
                };
                let mut notes: Vec<&str> = case_results
                    .iter()
                    .filter_map(|r| r.prefill_note.as_deref())
                    .collect();
                notes.dedup();
                for note in notes {
                    eprintln!("warning: {note}");
                }
                eprintln!(
                    "[{n}/{total}] {} {length} #{index} ({} tokens): {} | prefill {prefill:.1} s{cached}, case {:.1} s",
                    task.name(),
                    case.ids.len(),
                    scores.join(", "),
                    started.elapsed().as_secs_f64()
                );
                results.retain(|r| {
                    !(r.task == task
                        && r.length == length
                        && r.index == index
                        && labels.contains(&r.attention))
                });
                results.extend(case_results);
                if let Some(path) = &a.json {
                    write_results(path, &results)?;
                }
            }
        }
    }
    // Tables over what was asked this time (a resumed JSON may hold more).
    let asked: Vec<&CaseResult> = results
        .iter()
        .filter(|r| {
            a.lengths.contains(&r.length)
                && tasks.contains(&r.task)
                && r.index < a.cases
                && labels.contains(&r.attention)
        })
        .collect();
    let grid = Grid::new(&asked);
    for label in &labels {
        println!("\nRULER score (%): {label}\n");
        print_task_table(&grid, label, &tasks, &a.lengths);
    }
    for &length in &a.lengths {
        println!("\nRULER score (%) by task family at {length} tokens\n");
        print_family_table(&grid, &labels, &tasks, length);
    }
    if let Some(path) = &a.plot {
        let series: Vec<Series> = labels
            .iter()
            .map(|l| Series {
                label: l.clone(),
                scores: a
                    .lengths
                    .iter()
                    .map(|&len| grid.average(l, &tasks, len).map(|s| s * 100.0))
                    .collect(),
            })
            .collect();
        let title = format!(
            "RULER: {} ({} tasks, {} cases each)",
            a.model
                .resolve()
                .ok()
                .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
                .unwrap_or_default(),
            tasks.len(),
            a.cases
        );
        score_plot::write(path, &title, &a.lengths, &series)?;
        eprintln!("plot written to {}", path.display());
    }
    Ok(())
}

/// `choice` with every selection policy's budget set to `share` of `length` positions
/// (see `--read-share`).
fn at_read_share(choice: &AttentionChoice, share: f64, length: usize) -> AttentionChoice {
    let n = (share * length as f64).ceil() as usize;
    let mut c = choice.clone();
    c.settings_mut::<QuestSettings>().budget = n;
    c.settings_mut::<OracleSettings>().budget = n;
    c.settings_mut::<SketchSettings>().budget = n;
    let s = c.settings_mut::<StreamingAttention>();
    s.window = n.saturating_sub(s.sinks).max(1);
    let h = c.settings_mut::<H2oSettings>();
    (h.heavy, h.recent) = (share / 2.0, share / 2.0);
    let sa = c.settings_mut::<SaapSettings>();
    sa.budget = share;
    sa.max_read = sa.max_read.max(n);
    c
}

/// Mean score per (policy, task, length).
struct Grid {
    cells: BTreeMap<(String, &'static str, usize), (f64, usize)>,
}

impl Grid {
    fn new(results: &[&CaseResult]) -> Grid {
        let mut cells: BTreeMap<(String, &'static str, usize), (f64, usize)> = BTreeMap::new();
        for r in results {
            let c = cells
                .entry((r.attention.clone(), r.task.name(), r.length))
                .or_default();
            c.0 += r.score;
            c.1 += 1;
        }
        Grid { cells }
    }

    fn task(&self, label: &str, task: Task, length: usize) -> Option<f64> {
        self.cells
            .get(&(label.to_string(), task.name(), length))
            .map(|&(sum, n)| sum / n as f64)
    }

    /// Mean over `tasks` (each task weighs the same); `None` unless every task was run.
    fn average(&self, label: &str, tasks: &[Task], length: usize) -> Option<f64> {
        let scores: Option<Vec<f64>> = tasks.iter().map(|&t| self.task(label, t, length)).collect();
        scores
            .filter(|s| !s.is_empty())
            .map(|s| s.iter().sum::<f64>() / s.len() as f64)
    }
}

fn cell(v: Option<f64>) -> String {
    v.map_or("–".into(), |s| format!("{:.1}", s * 100.0))
}

fn print_task_table(grid: &Grid, label: &str, tasks: &[Task], lengths: &[usize]) {
    let head: Vec<String> = lengths.iter().map(|l| l.to_string()).collect();
    println!("| task | {} |", head.join(" | "));
    println!("| :--- |{}", " ---: |".repeat(lengths.len()));
    for &t in tasks {
        let row: Vec<String> = lengths
            .iter()
            .map(|&l| cell(grid.task(label, t, l)))
            .collect();
        println!("| {} | {} |", t.name(), row.join(" | "));
    }
    let avg: Vec<String> = lengths
        .iter()
        .map(|&l| cell(grid.average(label, tasks, l)))
        .collect();
    println!("| **average** | {} |", avg.join(" | "));
}

fn print_family_table(grid: &Grid, labels: &[String], tasks: &[Task], length: usize) {
    let families: Vec<Family> = Family::ALL
        .into_iter()
        .filter(|f| tasks.iter().any(|t| t.family() == *f))
        .collect();
    let members =
        |f: Family| -> Vec<Task> { tasks.iter().copied().filter(|t| t.family() == f).collect() };
    // Per label: each family's score, then the average.
    let scores = |label: &str| -> Vec<Option<f64>> {
        families
            .iter()
            .map(|&f| grid.average(label, &members(f), length))
            .chain(std::iter::once(grid.average(label, tasks, length)))
            .collect()
    };
    let reference = labels.iter().any(|l| l == "full").then(|| scores("full"));
    let head: Vec<&str> = families.iter().map(|f| f.name()).collect();
    let verdict_head = if reference.is_some() {
        " vs full |"
    } else {
        ""
    };
    println!("| policy | {} | average |{verdict_head}", head.join(" | "));
    println!(
        "| :--- |{} ---: |{}",
        " ---: |".repeat(families.len()),
        if reference.is_some() { " :--- |" } else { "" }
    );
    for label in labels {
        let own = scores(label);
        let cells: Vec<String> = own.iter().map(|&v| cell(v)).collect();
        let verdict = match &reference {
            Some(full) if label != "full" => {
                format!(" {} |", against_full(&own, full, &head, FULL_MARGIN))
            }
            Some(_) => " reference |".to_string(),
            None => String::new(),
        };
        println!("| {label} | {} |{verdict}", cells.join(" | "));
    }
}

/// Points (of 100) a policy may lose to full attention and still count as keeping up: the
/// issue's goal, on the average and on every task family.
const FULL_MARGIN: f64 = 3.0;

/// Whether `own` (each family's score, then the average; 0 to 1) stays within `margin`
/// points of `full` (the same, for full attention) everywhere, and if not by how much it
/// falls short where: `within 3 (avg −2.5)` or `short: multi-value −12.5, avg −3.4`.
fn against_full(
    own: &[Option<f64>],
    full: &[Option<f64>],
    families: &[&str],
    margin: f64,
) -> String {
    let gap = |i: usize| -> Option<f64> { Some((own[i]? - full[i]?) * 100.0) };
    let avg = own.len() - 1;
    if (0..own.len()).any(|i| gap(i).is_none()) {
        return "–".into();
    }
    let short: Vec<String> = (0..avg)
        .filter_map(|i| {
            gap(i)
                .filter(|g| *g < -margin)
                .map(|g| format!("{} {g:+.1}", families[i]))
        })
        .chain(
            gap(avg)
                .filter(|g| *g < -margin)
                .map(|g| format!("avg {g:+.1}")),
        )
        .collect();
    if short.is_empty() {
        format!("within {margin:.0} (avg {:+.1})", gap(avg).unwrap_or(0.0))
    } else {
        format!("short: {}", short.join(", "))
    }
}

fn read_results(path: &std::path::Path) -> Result<Vec<CaseResult>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a RULER results file: {e}", path.display()))?;
    serde_json::from_value(v["results"].clone())
        .map_err(|e| format!("{} is not a RULER results file: {e}", path.display()))
}

fn write_results(path: &std::path::Path, results: &[CaseResult]) -> Result<(), String> {
    let doc = serde_json::json!({ "benchmark": "ruler", "results": results });
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    // Write beside and rename, so a run stopped mid-write leaves the previous file whole.
    let tmp = path.with_extension("json.partial");
    std::fs::write(&tmp, text).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_names_every_family_short_of_full_and_only_those() {
        let fams = ["single", "aggregation"];
        let full = [Some(1.0), Some(0.5), Some(0.75)];
        // Two points under on one family, within the margin.
        let close = [Some(1.0), Some(0.48), Some(0.74)];
        assert_eq!(
            against_full(&close, &full, &fams, 3.0),
            "within 3 (avg -1.0)"
        );
        // Above full everywhere: within, with a positive gap.
        let above = [Some(1.0), Some(0.7), Some(0.85)];
        assert_eq!(
            against_full(&above, &full, &fams, 3.0),
            "within 3 (avg +10.0)"
        );
        // Short on one family by 12.5, the average by 6.25.
        let short = [Some(1.0), Some(0.375), Some(0.6875)];
        assert_eq!(
            against_full(&short, &full, &fams, 3.0),
            "short: aggregation -12.5, avg -6.2"
        );
        // A family without a score: no verdict.
        let missing = [Some(1.0), None, Some(0.5)];
        assert_eq!(against_full(&missing, &full, &fams, 3.0), "–");
    }

    #[test]
    fn a_read_share_sets_every_budget_for_the_length() {
        let c = at_read_share(&AttentionChoice::named("quest"), 0.05, 8192);
        assert_eq!(c.settings::<QuestSettings>().budget, 410);
        assert_eq!(c.settings::<OracleSettings>().budget, 410);
        assert_eq!(c.settings::<SketchSettings>().budget, 410);
        let s = c.settings::<StreamingAttention>();
        assert_eq!(s.sinks + s.window, 410);
        let h = c.settings::<H2oSettings>();
        assert_eq!((h.heavy, h.recent), (0.025, 0.025));
        assert_eq!(c.settings::<SaapSettings>().budget, 0.05);
        assert!(c.settings::<SaapSettings>().max_read >= 410);
        let c = at_read_share(&c, 0.05, 32768);
        assert_eq!(c.settings::<QuestSettings>().budget, 1639);
    }

    #[test]
    fn task_lists_are_parsed_and_checked() {
        assert_eq!(tasks(&["all".into()]).unwrap().len(), 11);
        assert_eq!(
            tasks(&["vt".into(), "cwe".into(), "vt".into()]).unwrap(),
            [Task::Vt, Task::Cwe]
        );
        let e = tasks(&["qa_1".into()]).unwrap_err();
        assert!(e.contains("unknown RULER task 'qa_1'"), "{e}");
    }

    fn result(attention: &str, task: Task, length: usize, score: f64) -> CaseResult {
        CaseResult {
            task,
            length,
            index: 0,
            seed: 0,
            prompt_tokens: 0,
            attention: attention.into(),
            settings: String::new(),
            expected: vec![],
            answer: String::new(),
            score,
            prefill_seconds: 0.0,
            prefill_cached: false,
            prefill_note: None,
            decode_seconds: 0.0,
        }
    }

    #[test]
    fn averages_weigh_tasks_equally_and_need_every_task() {
        let rs = [
            result("full", Task::Vt, 4096, 1.0),
            result("full", Task::Cwe, 4096, 0.5),
            result("full", Task::Cwe, 4096, 0.0),
            result("quest", Task::Vt, 4096, 1.0),
        ];
        let refs: Vec<&CaseResult> = rs.iter().collect();
        let g = Grid::new(&refs);
        assert_eq!(g.task("full", Task::Cwe, 4096), Some(0.25));
        assert_eq!(g.average("full", &[Task::Vt, Task::Cwe], 4096), Some(0.625));
        assert_eq!(g.average("quest", &[Task::Vt, Task::Cwe], 4096), None);
        assert_eq!(g.average("full", &[Task::Vt], 8192), None);
    }

    #[test]
    fn results_files_round_trip() {
        let dir = std::env::temp_dir().join(format!("sparrow-ruler-json-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.json");
        let rs = vec![result("full", Task::Fwe, 8192, 0.5)];
        write_results(&path, &rs).unwrap();
        let back = read_results(&path).unwrap();
        assert_eq!(back.len(), 1);
        assert_eq!(
            (back[0].task, back[0].length, back[0].score),
            (Task::Fwe, 8192, 0.5)
        );
        std::fs::write(&path, "{}").unwrap();
        let e = read_results(&path).unwrap_err();
        assert!(e.contains("not a RULER results file"), "{e}");
    }
}
