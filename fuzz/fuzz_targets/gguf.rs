//! The GGUF reader: header, metadata, tensor infos, and every tensor the parse accepts read
//! through its block layout (f32, f16, bf16 and the quantized formats), as a model load does.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qkv::weights::gguf::GgufFile;

fuzz_target!(|data: &[u8]| {
    let path = qkv_fuzz::scratch_file("input.gguf", data);
    let Ok(file) = GgufFile::open(&path) else {
        return;
    };
    let _ = format!("{file:?}");
    let _ = (file.version(), file.alignment(), file.data_offset());
    for (key, value) in file.metadata_entries() {
        let _ = value.to_string();
        let _ = (
            value.as_u32(),
            value.as_f32(),
            value.as_str(),
            value.as_bool(),
        );
        let _ = file.get_str_array(key);
        let _ = file.get_i32_array(key);
        let _ = file.get_f32_array(key);
    }
    for info in file.tensor_infos() {
        let bytes = file
            .tensor_bytes(&info.name)
            .expect("a listed tensor has bytes");
        assert_eq!(bytes.len(), info.n_bytes, "tensor `{}`", info.name);
    }
    qkv_fuzz::exercise_tensors(&file);
    // The tokenizer target covers vocabularies; here only that a file's metadata never
    // panics the tokenizer builder.
    let _ = qkv::tokenizer::Tokenizer::from_gguf(&file);
});
