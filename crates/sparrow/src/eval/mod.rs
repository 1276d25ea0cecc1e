//! Quality evaluations that run on a real model: needle-in-a-haystack retrieval.

pub mod needle;
