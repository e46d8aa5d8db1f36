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
    /// A state (a KV cache, a decoder state, an engine's or session's cache, a seq2seq
    /// encoder memory) made by one model was handed to another. Each model's keys and values
    /// are its own, even between models of the same shape, so it is refused.
    ForeignState {
        /// What kind of state (`"KV cache"`, `"encoder memory"`).
        state: &'static str,
        /// The number of the model that made it (unique within the process).
        made_by: u64,
        /// The number of the model it was given to.
        used_with: u64,
    },
    /// A tensor's data runs past the end of its file (a truncated or hostile file).
    TensorPastEnd {
        /// The file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// Byte offset in the file where its data starts (saturating at `u64::MAX`).
        offset: u64,
        /// Bytes its data takes (saturating at `u64::MAX`).
        length: u64,
        /// Bytes in the file.
        file_size: u64,
    },
    /// A tensor's data in a mapped file is not aligned for its element type, so it cannot be
    /// read in place ([`Tensor::from_mapped`](crate::weights::Tensor::from_mapped) copies it
    /// instead).
    MisalignedTensor {
        /// The file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// Byte offset in the file where its data starts.
        offset: u64,
        /// The alignment its element type needs, in bytes.
        align: usize,
    },
    /// The allocator refused the memory for a large buffer (a KV cache, scratch, logits,
    /// widened weights): ask for a shorter context, fewer sequences or a narrower dtype.
    AllocationRefused {
        /// What the memory was for.
        what: String,
        /// Bytes asked for (saturating at `usize::MAX` when the size itself overflows).
        bytes: usize,
    },
    /// A model produced a logit that is NaN or infinite where a token was to be chosen or
    /// scored (broken weights, or an overflow in the forward pass): no token is picked from
    /// it.
    NonFiniteLogits {
        /// Which sequence of a batch, when the logits are one of several.
        sequence: Option<usize>,
        /// The position whose logits these are (they follow the token at this index of the
        /// sequence or text), when known.
        position: Option<usize>,
        /// The index in the vocabulary of the first logit that is not finite.
        token: usize,
        /// Its value.
        value: f32,
    },
    /// A saved slot (an [`Engine`](crate::engine::Engine) sequence's tokens and KV cache, as
    /// [`Engine::save_slot`](crate::engine::Engine::save_slot) writes them) cannot be
    /// restored: its bytes are truncated, corrupt or of another version, or it belongs to
    /// another model or KV cache type or does not fit the context. Nothing is changed.
    SlotState(String),
    /// A slot operation named a slot that does not exist, or one that is running a sequence.
    Slot {
        /// The slot asked for.
        slot: usize,
        /// Why it cannot be used (`"does not exist (the engine has 2)"`, `"is busy"`).
        why: String,
    },
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
            Error::SlotState(msg) => write!(f, "saved slot: {msg}"),
            Error::Slot { slot, why } => write!(f, "slot {slot} {why}"),
            Error::QueueFull { capacity } => {
                write!(f, "busy: {capacity} requests are already waiting")
            }
            Error::Tokenizer(msg) => write!(f, "tokenizer: {msg}"),
            Error::ChatTemplate { template, msg } => write!(f, "chat template {template}: {msg}"),
            Error::Kernel(e) => write!(f, "kernel: {e}"),
            Error::ForeignState {
                state,
                made_by,
                used_with,
            } => write!(
                f,
                "a {state} made by another model (#{made_by}) was given to model #{used_with}; \
                 a state serves only the model that made it"
            ),
            Error::TensorPastEnd {
                path,
                tensor,
                offset,
                length,
                file_size,
            } => write!(
                f,
                "{}: tensor `{tensor}` ({length} bytes at offset {offset}) runs past the end of \
                 the file ({file_size} bytes)",
                path.display()
            ),
            Error::MisalignedTensor {
                path,
                tensor,
                offset,
                align,
            } => write!(
                f,
                "{}: tensor `{tensor}` at offset {offset} is not aligned to {align} bytes",
                path.display()
            ),
            Error::AllocationRefused { what, bytes } => write!(
                f,
                "{what} needs {bytes} bytes, more than this machine gives; ask for a shorter \
                 context or fewer sequences"
            ),
            Error::NonFiniteLogits {
                sequence,
                position,
                token,
                value,
            } => {
                write!(f, "logit {token} is {value}, not a finite number")?;
                if let Some(s) = sequence {
                    write!(f, ", in sequence {s}")?;
                }
                if let Some(p) = position {
                    write!(f, ", after position {p}")?;
                }
                Ok(())
            }
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
