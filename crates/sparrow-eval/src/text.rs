//! Text from a folder of `.txt` files — the haystacks of the needle and RULER tests, the
//! books Saap's training contexts are recorded from — read one way, with errors that name
//! the file or folder.

use sparrow::{Error, Result};
use std::path::{Path, PathBuf};

/// The `.txt` files of `dir` in file-name order; an error naming the folder when it cannot
/// be read or holds none.
pub fn text_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| Error::Other(format!("cannot read text folder {}: {e}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::Other(format!("no .txt files in {}", dir.display())));
    }
    Ok(files)
}

/// Filler text: every `.txt` file of `dir` in file-name order, concatenated.
pub fn load_haystack(dir: &Path) -> Result<String> {
    let files = text_files(dir)?;
    let mut text = String::new();
    for f in files {
        text.push_str(&read_text(&f)?);
        text.push('\n');
    }
    Ok(text)
}

/// The text of `file`, or an error naming it.
pub fn read_text(file: &Path) -> Result<String> {
    std::fs::read_to_string(file)
        .map_err(|e| Error::Other(format!("cannot read {}: {e}", file.display())))
}
