//! The error type of the `qkv` crate: every public call returns [`Result`], and every variant
//! names the file, tensor, dimension or token at fault.

use std::fmt;
use std::path::PathBuf;

pub use qkv_kernels::KernelError;

/// Everything that can go wrong in qkv, with enough context to act on.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A file could not be opened, mapped or read.
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A weights or tokenizer file is malformed, truncated or hostile.
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// One of the typed errors below (a missing tensor, a wrong shape, an unsupported dtype,
    /// an invalid configuration), found while loading the file `path`. Match on `source` for
    /// the cause; the message reads `path: cause`.
    InFile {
        /// The file (or model directory).
        path: PathBuf,
        /// What is wrong in it.
        source: Box<Error>,
    },
    /// A tensor the model needs is not in the file.
    MissingTensor {
        /// Its name.
        name: String,
    },
    /// A tensor's shape disagrees with the model configuration.
    TensorShape {
        /// Its name.
        name: String,
        /// The shape the configuration implies.
        expected: Vec<usize>,
        /// The shape in the file.
        actual: Vec<usize>,
    },
    /// A tensor is stored in a dtype qkv cannot compute with or convert.
    UnsupportedDType {
        /// The tensor's name.
        name: String,
        /// The dtype, as the file names it.
        dtype: String,
    },
    /// A model configuration is inconsistent (e.g. `dim` not divisible by `heads`).
    Config(String),
    /// A feature of the file or request is not supported (architecture, tokenizer model…).
    Unsupported(String),
    /// An input has the wrong shape or length (e.g. a mask that does not fit the batch).
    Shape(String),
    /// A token id outside the vocabulary.
    TokenOutOfRange {
        /// The token id.
        id: u32,
        /// The vocabulary size.
        vocab: usize,
    },
    /// The KV cache cannot hold the requested positions.
    ContextFull {
        /// Positions the operation needs in total.
        needed: usize,
        /// The cache's capacity.
        capacity: usize,
    },
    /// The queue of waiting requests is full; try again later.
    QueueFull {
        /// How many requests the queue holds.
        capacity: usize,
    },
    /// Text could not be tokenized or a token could not be decoded.
    Tokenizer(String),
    /// A chat template failed to compile or to render (a syntax error, an undefined value
    /// used, or the template's own `raise_exception`, e.g. refusing a system message).
    ChatTemplate {
        /// Where the template came from (the model file and key).
        template: String,
        /// minijinja's message.
        msg: String,
    },
    /// A kernel rejected its arguments.
    Kernel(KernelError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { path, source } => write!(f, "{}: {source}", path.display()),
            Error::Format { path, msg } => write!(f, "{}: {msg}", path.display()),
            Error::InFile { path, source } => write!(f, "{}: {source}", path.display()),
            Error::MissingTensor { name } => write!(f, "tensor `{name}` is missing"),
            Error::TensorShape {
                name,
                expected,
                actual,
            } => write!(
                f,
                "tensor `{name}` has shape {actual:?}, the configuration needs {expected:?}"
            ),
            Error::UnsupportedDType { name, dtype } => {
                write!(f, "tensor `{name}` has unsupported dtype {dtype}")
            }
            Error::Config(msg) => write!(f, "invalid configuration: {msg}"),
            Error::Unsupported(msg) => write!(f, "unsupported: {msg}"),
            Error::Shape(msg) => write!(f, "wrong shape: {msg}"),
            Error::TokenOutOfRange { id, vocab } => {
                write!(f, "token id {id} is outside the vocabulary of {vocab}")
            }
            Error::ContextFull { needed, capacity } => write!(
                f,
                "context full: {needed} positions needed, the cache holds {capacity}"
            ),
            Error::QueueFull { capacity } => {
                write!(f, "busy: {capacity} requests are already waiting")
            }
            Error::Tokenizer(msg) => write!(f, "tokenizer: {msg}"),
            Error::ChatTemplate { template, msg } => write!(f, "chat template {template}: {msg}"),
            Error::Kernel(e) => write!(f, "kernel: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            Error::InFile { source, .. } => Some(&**source),
            Error::Kernel(e) => Some(e),
            _ => None,
        }
    }
}

impl From<KernelError> for Error {
    fn from(e: KernelError) -> Self {
        Error::Kernel(e)
    }
}

/// Result alias for qkv.
pub type Result<T> = std::result::Result<T, Error>;
