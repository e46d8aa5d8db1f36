//! The seed-004 encoder–decoder Transformer against PyTorch: teacher-forced logits,
//! step-by-step decoding with the KV cache, batched greedy decoding, f16 weights, errors.

use qkv::models::seq2seq::{Seq2Seq, Seq2SeqConfig, TokenBatch};
use qkv::nn::KeyPadding;
use qkv::weights::{Tensor, TensorSource};
use qkv::Error;

mod common;
use common::{assert_close, Case, F16_TOL, F32_TOL};

fn config(c: &Case) -> Seq2SeqConfig {
    Seq2SeqConfig::from_metadata(&c.weights.metadata()).unwrap()
}

fn model(c: &Case) -> Seq2Seq {
    Seq2Seq::load(&c.weights, config(c)).unwrap()
}

/// `source` with the values of one tensor changed by an edit.
struct Edited<'a>(&'a dyn TensorSource, &'static str, fn(&mut [f32]));

impl TensorSource for Edited<'_> {
    fn tensor(&self, name: &str) -> qkv::Result<Tensor> {
        let t = self.0.tensor(name)?;
        if name != self.1 {
            return Ok(t);
        }
        let mut data = t.to_f32_vec()?;
        (self.2)(&mut data);
        Tensor::from_f32(name, t.shape().to_vec(), data)
    }
    fn contains(&self, name: &str) -> bool {
        self.0.contains(name)
    }
    fn names(&self) -> Vec<String> {
        self.0.names()
    }
}

const B: usize = 3;
const S: usize = 7;
const T: usize = 6;

fn teacher_forced(name: &str, tol: f32) {
    let c = Case::open(name);
    let m = model(&c);
    let (src, tgt) = (c.ints::<u32>("src"), c.ints::<u32>("tgt"));
    let (sl, tl) = (
        c.ints::<usize>("src_lengths"),
        c.ints::<usize>("tgt_lengths"),
    );
    let src = TokenBatch::new(&src, B, S, &sl).unwrap();
    let tgt = TokenBatch::new(&tgt, B, T, &tl).unwrap();
    let logits = m.forward(&src, &tgt).unwrap();
    assert_eq!(logits.shape(), [B, T, 19]);
    assert_close(logits.data(), &c.get("logits"), tol, name);
}

#[test]
fn teacher_forced_logits_match_pytorch() {
    teacher_forced("seq2seq", F32_TOL);
}

#[test]
fn teacher_forced_logits_match_pytorch_f16_weights() {
    teacher_forced("seq2seq_f16", F16_TOL);
}

fn step_by_step(name: &str, tol: f32) {
    let c = Case::open(name);
    let m = model(&c);
    let (src, tgt) = (c.ints::<u32>("src"), c.ints::<u32>("tgt"));
    let sl = c.ints::<usize>("src_lengths");
    let src = TokenBatch::new(&src, B, S, &sl).unwrap();
    let full = [T; B];
    let tgt_batch = TokenBatch::new(&tgt, B, T, &full).unwrap();
    let memory = m.encode(&src).unwrap();
    let forced = m.decode_teacher_forced(&memory, &tgt_batch).unwrap();
    let mut state = m.start(memory, T).unwrap();
    let vocab = 19;
    let mut stepped = vec![0.0; B * T * vocab];
    for t in 0..T {
        let tokens: Vec<u32> = (0..B).map(|b| tgt[b * T + t]).collect();
        let logits = m.step(&mut state, &tokens).unwrap();
        for b in 0..B {
            stepped[(b * T + t) * vocab..(b * T + t + 1) * vocab]
                .copy_from_slice(&logits[b * vocab..(b + 1) * vocab]);
        }
    }
    assert_eq!(state.position(), T);
    // The cache is full: one more step is a typed error, not a panic.
    assert!(matches!(
        m.step(&mut state, &[0, 0, 0]),
        Err(Error::ContextFull { .. })
    ));
    assert_close(
        &stepped,
        forced.data(),
        1e-5,
        "step-by-step vs teacher-forced",
    );
    assert_close(
        &stepped,
        &c.get("logits_full"),
        tol,
        "step-by-step vs PyTorch",
    );
}

#[test]
fn step_by_step_equals_teacher_forced() {
    step_by_step("seq2seq", F32_TOL);
}

#[test]
fn step_by_step_equals_teacher_forced_f16_weights() {
    step_by_step("seq2seq_f16", F16_TOL);
}

fn greedy(name: &str) {
    let c = Case::open(name);
    let m = model(&c);
    let src = c.ints::<u32>("src");
    let sl = c.ints::<usize>("src_lengths");
    let src = TokenBatch::new(&src, B, S, &sl).unwrap();
    let (bos, eos, max_len) = (
        c.meta("bos") as u32,
        c.meta("eos") as u32,
        c.meta("max_len"),
    );
    let got = m.greedy(&src, bos, eos, max_len).unwrap();
    let flat = c.ints::<u32>("greedy_tokens");
    let lens = c.ints::<usize>("greedy_lengths");
    let mut at = 0;
    for (b, &n) in lens.iter().enumerate() {
        assert_eq!(got[b], flat[at..at + n], "{name}: sequence {b}");
        at += n;
    }
    // The fixture covers both stopping at EOS and running to max_len.
    assert!(lens.iter().any(|&n| n < max_len) && lens.contains(&max_len));
}

#[test]
fn greedy_decode_batched_matches_pytorch() {
    greedy("seq2seq");
}

#[test]
fn greedy_decode_batched_matches_pytorch_f16_weights() {
    greedy("seq2seq_f16");
}

#[test]
fn source_pads_anywhere_are_ignored_by_cross_attention() {
    // Changing the token under a padded source position changes nothing once it is masked.
    let c = Case::open("seq2seq");
    let m = model(&c);
    let mut src = c.ints::<u32>("src");
    let mut keep = vec![true; B * S];
    keep[S + 2] = false; // a pad in the middle of sequence 1
    let pads = KeyPadding::from_flags(keep.clone(), B, S).unwrap();
    let tgt = c.ints::<u32>("tgt");
    let full = [T; B];
    let tgt = TokenBatch::new(&tgt, B, T, &full).unwrap();
    let a = m.encode_with_padding(&src, B, S, pads.clone()).unwrap();
    src[S + 2] = (src[S + 2] + 1) % 23;
    let b = m.encode_with_padding(&src, B, S, pads).unwrap();
    let la = m.decode_teacher_forced(&a, &tgt).unwrap();
    let lb = m.decode_teacher_forced(&b, &tgt).unwrap();
    // Real encoder positions and every decoder logit are unchanged.
    for (i, &k) in keep.iter().enumerate() {
        if k {
            assert_close(
                &b.output().data()[i * 16..(i + 1) * 16],
                &a.output().data()[i * 16..(i + 1) * 16],
                1e-6,
                "encoder row",
            );
        }
    }
    assert_close(lb.data(), la.data(), 1e-6, "logits");
}

#[test]
fn a_model_refuses_another_models_memory_and_state() {
    let c = Case::open("seq2seq");
    let (a, b) = (model(&c), model(&c));
    let lens = [2];
    let src = TokenBatch::new(&[3, 4], 1, 2, &lens).unwrap();
    let tgt = TokenBatch::new(&[1, 5], 1, 2, &lens).unwrap();
    // The same weights even, but not the model that made them: refused, not used.
    let memory = a.encode(&src).unwrap();
    assert!(matches!(
        b.decode_teacher_forced(&memory, &tgt),
        Err(Error::ForeignState {
            state: "encoder memory",
            ..
        })
    ));
    let mut state = a.start(memory, 4).unwrap();
    match b.step(&mut state, &[1]) {
        Err(
            e @ Error::ForeignState {
                made_by, used_with, ..
            },
        ) => {
            assert_ne!(made_by, used_with);
            assert!(e.to_string().contains("another model"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(state.position(), 0);
    assert!(a.step(&mut state, &[1]).is_ok());
    assert!(matches!(
        b.start(a.encode(&src).unwrap(), 4),
        Err(Error::ForeignState { .. })
    ));
}

#[test]
fn hostile_sizes_and_broken_weights_are_errors() {
    let c = Case::open("seq2seq");
    let cfg = config(&c);
    for bad in [
        Seq2SeqConfig {
            ffn_scale: usize::MAX,
            ..cfg.clone()
        },
        Seq2SeqConfig {
            max_tgt_len: usize::MAX,
            ..cfg.clone()
        },
        Seq2SeqConfig {
            max_src_len: (1 << 20) + 1,
            ..cfg.clone()
        },
    ] {
        assert!(matches!(bad.validate(), Err(Error::Config(_))), "{bad:?}");
        assert!(matches!(
            Seq2Seq::load(&c.weights, bad),
            Err(Error::Config(_))
        ));
    }
    // NaN in the output projection: greedy decoding says so instead of emitting token 0.
    assert!(c.weights.contains("generator.bias"));
    let poisoned = Edited(&c.weights, "generator.bias", |v| v[7] = f32::NAN);
    let m = Seq2Seq::load(&poisoned, cfg).unwrap();
    let lens = [2];
    let src = TokenBatch::new(&[3, 4], 1, 2, &lens).unwrap();
    match m.greedy(&src, 1, 2, 5) {
        Err(Error::NonFiniteLogits {
            sequence: Some(0),
            position: Some(0),
            token: 7,
            value,
        }) => assert!(value.is_nan()),
        other => panic!("{other:?}"),
    }
}

/// PyTorch's `pe` buffer, when the checkpoint holds it, is what the model adds: its own table
/// can differ from a recomputed one by an ulp of `exp` in a few columns.
#[test]
fn the_checkpoints_positional_table_is_the_one_used() {
    let c = Case::open("seq2seq");
    let plain = model(&c);
    let shift = |v: &mut [f32]| v.iter_mut().for_each(|x| *x += 0.25);
    let shifted = Edited(&c.weights, "Encoder.pos_embedding.pe", shift);
    let shifted = Seq2Seq::load(&shifted, config(&c)).unwrap();
    let lens = [3];
    let src = TokenBatch::new(&[3, 4, 5], 1, 3, &lens).unwrap();
    let a = plain.encode(&src).unwrap();
    let b = shifted.encode(&src).unwrap();
    assert_ne!(a.output().data(), b.output().data());
}

#[test]
fn errors_are_typed() {
    let c = Case::open("seq2seq");
    let cfg = config(&c);
    // Heads not dividing d_model.
    let bad = Seq2SeqConfig {
        heads: 3,
        ..cfg.clone()
    };
    assert!(matches!(
        Seq2Seq::load(&c.weights, bad),
        Err(Error::Config(_))
    ));
    // A shape disagreeing with the configuration, named.
    let bad = Seq2SeqConfig {
        src_vocab: 24,
        ..cfg.clone()
    };
    match Seq2Seq::load(&c.weights, bad) {
        Err(Error::TensorShape { name, .. }) => assert_eq!(name, "src_embedding.weight"),
        other => panic!("{other:?}"),
    }
    let bad = Seq2SeqConfig {
        max_src_len: 20,
        ..cfg.clone()
    };
    match Seq2Seq::load(&c.weights, bad) {
        Err(Error::TensorShape { name, .. }) => assert_eq!(name, "Encoder.pos_embedding.pe"),
        other => panic!("{other:?}"),
    }
    // A missing tensor, named.
    let bad = Seq2SeqConfig {
        encoder_layers: 3,
        ..cfg.clone()
    };
    match Seq2Seq::load(&c.weights, bad) {
        Err(Error::MissingTensor { name }) => assert_eq!(name, "Encoder.Layers.2.attn.wq.weight"),
        other => panic!("{other:?}"),
    }
    assert!(Seq2SeqConfig::from_metadata(&Default::default()).is_err());

    let m = model(&c);
    // Token ids outside the vocabularies.
    let lens = [2];
    let src = TokenBatch::new(&[3, 23], 1, 2, &lens).unwrap();
    assert!(matches!(
        m.encode(&src),
        Err(Error::TokenOutOfRange { id: 23, vocab: 23 })
    ));
    // Even with nothing to generate.
    assert!(matches!(
        m.greedy(&src, 1, 2, 0),
        Err(Error::TokenOutOfRange { id: 23, vocab: 23 })
    ));
    let src = TokenBatch::new(&[3, 4], 1, 2, &lens).unwrap();
    assert!(matches!(
        m.greedy(&src, 19, 2, 5),
        Err(Error::TokenOutOfRange { id: 19, .. })
    ));
    let memory = m.encode(&src).unwrap();
    let mut state = m.start(memory, 4).unwrap();
    assert!(matches!(
        m.step(&mut state, &[40]),
        Err(Error::TokenOutOfRange { id: 40, vocab: 19 })
    ));
    // Wrong batch / lengths / mask shapes.
    assert!(matches!(m.step(&mut state, &[1, 2]), Err(Error::Shape(_))));
    assert!(matches!(
        TokenBatch::new(&[3, 4], 1, 2, &[3]),
        Err(Error::Shape(_))
    ));
    assert!(matches!(
        TokenBatch::new(&[3, 4], 1, 2, &[0]),
        Err(Error::Shape(_))
    ));
    assert!(matches!(
        TokenBatch::new(&[3, 4], 2, 2, &[1, 1]),
        Err(Error::Shape(_))
    ));
    let pads = KeyPadding::from_lengths(&[1, 1], 2).unwrap();
    assert!(matches!(
        m.encode_with_padding(&[3, 4], 1, 2, pads),
        Err(Error::Shape(_))
    ));
    // The embedded entry points check their inputs against each other.
    let d = cfg.d_model;
    let one = qkv::nn::SeqBuf::new(vec![0.1; d], 1, 1, d).unwrap();
    let two = qkv::nn::SeqBuf::new(vec![0.1; 2 * d], 2, 1, d).unwrap();
    let narrow = qkv::nn::SeqBuf::new(vec![0.1; 2], 1, 1, 2).unwrap();
    let (p1, p2) = (
        KeyPadding::all(1, 1).unwrap(),
        KeyPadding::all(2, 1).unwrap(),
    );
    for (y, enc, sp, tp) in [
        (&two, &one, &p1, &p2),
        (&one, &one, &p1, &p2),
        (&one, &one, &p2, &p1),
        (&narrow, &one, &p1, &p1),
    ] {
        assert!(matches!(
            m.decode_embedded(y.view(), enc.view(), sp, tp),
            Err(Error::Shape(_))
        ));
    }
    assert!(matches!(
        m.encode_embedded(one.view(), &p2),
        Err(Error::Shape(_))
    ));
    assert!(matches!(
        m.encode_embedded(narrow.view(), &p1),
        Err(Error::Shape(_))
    ));
    assert!(m.decode_embedded(one.view(), one.view(), &p1, &p1).is_ok());
    // Too long for the positional encoding / cache.
    let long = vec![1u32; 13];
    let src = TokenBatch::new(&long, 1, 13, &[13]).unwrap();
    assert!(matches!(m.encode(&src), Err(Error::ContextFull { .. })));
    let memory = m
        .encode(&TokenBatch::new(&[3, 4], 1, 2, &lens).unwrap())
        .unwrap();
    assert!(matches!(
        m.start(memory, 13),
        Err(Error::ContextFull { .. })
    ));
}
