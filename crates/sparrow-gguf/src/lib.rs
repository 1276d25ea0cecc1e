//! sparrow-gguf: a GGUF (v2/v3) reader over a memory map.
//!
//! Everything in the header, metadata and tensor table is validated with checked
//! arithmetic before use: a truncated or hostile file yields a [`GgufError`] that names the
//! key, tensor or byte offset at fault, never a panic or an out-of-bounds read.
//!
//! ```no_run
//! let f = sparrow_gguf::GgufFile::open("model.gguf")?;
//! let arch = f.metadata().get_str("general.architecture")?;
//! let t = f.require_tensor("token_embd.weight")?;
//! println!("{arch}: {} {:?} {}", t.name, t.dims, t.ty);
//! # Ok::<(), sparrow_gguf::GgufError>(())
//! ```

mod cursor;
mod error;
mod file;
mod parse;
mod tensor;
mod value;
mod writer;

pub use error::{GgufError, Result};
pub use file::GgufFile;
pub use parse::{DEFAULT_ALIGNMENT, MAX_DIMS};
pub use sparrow_quant::GgmlType;
pub use tensor::TensorInfo;
pub use value::{Metadata, Value};
pub use writer::GgufWriter;
