//! [`SafeTensorsDir`]: the weights of a Hugging Face model directory (one or more
//! `*.safetensors` files) as one [`TensorSource`]. [`Model::load`](crate::load::Model::load)
//! reads a directory's `config.json` and `tokenizer.json` and its weights through this.

use super::safetensors::SafeTensorsFile;
use super::{Tensor, TensorSource};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// All `*.safetensors` files of a directory as one tensor source: a Hugging Face model
/// directory, whose weights may be sharded over `model-00001-of-00002.safetensors` and so on.
/// A name found in several files comes from the last one in file-name order.
pub struct SafeTensorsDir {
    files: Vec<SafeTensorsFile>,
    /// Tensor name → index into `files`.
    index: HashMap<String, usize>,
}

impl SafeTensorsDir {
    /// Maps every `*.safetensors` file of `dir` and indexes their tensors by name.
    /// [`Error::Io`] when the directory cannot be listed or a file opened,
    /// [`Error::Format`] when it holds no `*.safetensors` file or one is malformed.
    pub fn open(dir: &Path) -> Result<SafeTensorsDir> {
        let io = |source| Error::Io {
            path: dir.to_owned(),
            source,
        };
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        paths.sort();
        if paths.is_empty() {
            return Err(Error::Format {
                path: dir.to_owned(),
                msg: "no *.safetensors file in the directory".into(),
            });
        }
        let mut files = Vec::with_capacity(paths.len());
        let mut index = HashMap::new();
        for p in paths {
            let f = SafeTensorsFile::open(&p)?;
            for name in f.names() {
                index.insert(name, files.len());
            }
            files.push(f);
        }
        Ok(SafeTensorsDir { files, index })
    }
}

impl std::fmt::Debug for SafeTensorsDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafeTensorsDir")
            .field(
                "files",
                &self.files.iter().map(|f| f.path()).collect::<Vec<_>>(),
            )
            .field("tensors", &self.index.len())
            .finish()
    }
}

impl TensorSource for SafeTensorsDir {
    fn tensor(&self, name: &str) -> Result<Tensor> {
        match self.index.get(name) {
            Some(&i) => self.files[i].tensor(name),
            None => Err(Error::MissingTensor {
                name: name.to_owned(),
            }),
        }
    }

    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn names(&self) -> Vec<String> {
        self.files.iter().flat_map(|f| f.names()).collect()
    }
}
