//! What the tests of qkv and qkv-cli share, built only with the `testing` feature (which
//! their dev-dependencies turn on): the [`synthetic`] model, written at test time so that
//! every model path runs offline. Not part of the library's API: the functions panic on
//! failure, as tests do.

pub mod synthetic;
