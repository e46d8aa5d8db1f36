//! The safetensors loader: header validation, then every tensor read as a model load does.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qkv::weights::safetensors::SafeTensorsFile;
use qkv::weights::TensorSource;

fuzz_target!(|data: &[u8]| {
    let path = qkv_fuzz::scratch_file("input.safetensors", data);
    let Ok(file) = SafeTensorsFile::open(&path) else {
        return;
    };
    let _ = format!("{file:?}");
    let _ = file.metadata();
    for name in file.names() {
        let _ = file.shape(&name);
    }
    qkv_fuzz::exercise_tensors(&file);
});
