//! `sparrow tokenize`: like `llama-tokenize --ids`.

use crate::{ModelArgs, PromptArgs};
use sparrow::tokenizer::{Tokenizer, TokenizerSpec};
use sparrow_gguf::GgufFile;

/// Arguments of `sparrow tokenize`.
#[derive(clap::Args, Debug)]
pub struct TokenizeArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    /// Treat special-token text such as <|im_start|> as plain text.
    #[arg(long = "no-parse-special")]
    no_parse_special: bool,
    /// Do not add BOS/EOS even if the model asks for them.
    #[arg(long = "no-bos")]
    no_bos: bool,
}

pub fn tokenize(a: TokenizeArgs) -> Result<(), String> {
    let text = a.prompt.text()?;
    let path = a.model.resolve()?;
    // Only the tokenizer is needed: no weights are touched.
    let file = GgufFile::open(&path).map_err(|e| e.to_string())?;
    let spec = TokenizerSpec::from_gguf(&file).map_err(|e| e.to_string())?;
    let tok = Tokenizer::from_spec(spec).map_err(|e| e.to_string())?;
    let ids = tok.encode(&text, !a.no_bos, !a.no_parse_special);
    let list: Vec<String> = ids.iter().map(u32::to_string).collect();
    println!("[{}]", list.join(", "));
    Ok(())
}
