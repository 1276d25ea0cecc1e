//! RULER's variable tracking (multi-hop tracing): a number is assigned to a variable, that
//! variable to another, and so on for a few hops, the statements scattered through noise
//! lines; the model must name every variable that ends up holding the number. Other chains
//! (other numbers) may run beside it. A short worked example comes first, as in RULER.

use super::niah::{interleaved, random_positions, NOISE};
use super::Draft;
use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use sparrow::Result;

/// One variable-tracking task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrackingSpec {
    /// Chains in the text; the first is asked about.
    pub chains: usize,
    /// Assignments from variable to variable per chain (its variables: hops + 1).
    pub hops: usize,
}

/// A chain: its variables in order of assignment, its number, and its statements.
struct Chain {
    names: Vec<String>,
    value: String,
    statements: Vec<String>,
}

impl TrackingSpec {
    /// The prompt with `size` noise lines, drawn from `seed`.
    pub fn draft(&self, size: usize, seed: u64) -> Result<Draft> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let example = self.instance(&mut rng, 3, self.hops.min(10), 8);
        let main = self.instance(&mut rng, 5, self.hops, size);
        let user = format!(
            "{}\n{} {}\n\n{}",
            example.user,
            example.answer_prefix,
            example.expected.join(" "),
            main.user
        );
        Ok(Draft { user, ..main })
    }

    /// One question: chains of variables of `letters` capital letters over `lines` noise
    /// lines.
    fn instance(&self, rng: &mut ChaCha8Rng, letters: usize, hops: usize, lines: usize) -> Draft {
        let mut used: Vec<String> = Vec::new();
        let mut values: Vec<String> = Vec::new();
        let chains: Vec<Chain> = (0..self.chains.max(1))
            .map(|_| {
                let names: Vec<String> = (0..=hops)
                    .map(|_| loop {
                        let n: String = (0..letters)
                            .map(|_| rng.random_range(b'A'..=b'Z') as char)
                            .collect();
                        if !used.contains(&n) {
                            used.push(n.clone());
                            break n;
                        }
                    })
                    .collect();
                let value = loop {
                    let v = rng.random_range(10_000u32..100_000).to_string();
                    if !values.contains(&v) {
                        values.push(v.clone());
                        break v;
                    }
                };
                let mut statements = vec![format!("VAR {} = {value}", names[0])];
                statements.extend(
                    names
                        .windows(2)
                        .map(|w| format!("VAR {} = VAR {}", w[1], w[0])),
                );
                Chain {
                    names,
                    value,
                    statements,
                }
            })
            .collect();
        let mut text: Vec<String> = vec![NOISE.to_string(); lines];
        // Each chain's statements go in order at sorted random lines of the text so far.
        for chain in &chains {
            let mut at = random_positions(rng, text.len() + 1, chain.statements.len());
            at.sort_unstable();
            text = interleaved(&text, &at, &chain.statements)
                .into_iter()
                .map(str::to_string)
                .collect();
        }
        let asked = &chains[0];
        let n = asked.names.len();
        Draft {
            user: format!(
                "Keep track of the chains of variable assignments hidden in the text below.\n\n{}\n\
                 Question: Which variables are assigned the value {} in the text above?",
                text.join("\n"),
                asked.value
            ),
            answer_prefix: format!(
                "Answer: Following the chains of assignments in the text above, {n} variables \
                 are assigned the value {}; they are:",
                asked.value
            ),
            expected: asked.names.clone(),
        }
    }
}
