//! The dedup engine, above the repository layer: the index strategies a
//! backup looks chunks up in, the container writer, the recipe resolver,
//! chunk copying between containers, a chunk's other stored copies, and
//! random-access reads of a version's files.

pub mod copies;
pub mod copy;
pub mod fsread;
pub mod index;
pub mod resolver;
pub mod similarity;
pub mod writer;
