//! The parts of the sparrow command line that are worth reaching from outside the binary:
//! the OpenAI wire format the server speaks (its request parser is fuzzed from `fuzz/`).

pub mod openai;
