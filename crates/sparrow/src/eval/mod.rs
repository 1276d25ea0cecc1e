//! Quality evaluations that run on a real model: needle-in-a-haystack retrieval, and how
//! closely each attention policy follows exact attention on real activations.

pub mod attention;
pub mod needle;
