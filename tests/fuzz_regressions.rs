//! Inputs found by the fuzz targets (fuzz/, see FUZZING.md) or that the targets' bounds are
//! about, kept as regression tests. Each holds its (minimized) input inline and checks for a
//! typed error where there was a crash, a hang or an out-of-memory abort.

use qkv::tokenizer::{ChatOptions, ChatTemplate, MAX_TEMPLATE_OUTPUT, MAX_TEMPLATE_SOURCE};
use qkv::weights::gguf::GgufFile;
use qkv::weights::{FloatType, TensorSource};
use qkv::Error;
use serde_json::json;
use std::sync::mpsc;
use std::time::Duration;

/// Renders `source` on a thread and gives its result, or fails the test when it takes more
/// than a minute (an unbounded render would otherwise hang the suite).
fn render_within_a_minute(source: &'static str) -> qkv::Result<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let messages = [json!({"role": "user", "content": "hi"})];
        let result =
            ChatTemplate::new("hostile", source).render(&messages, &ChatOptions::default());
        tx.send(result).ok();
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the render did not finish within a minute: it has no time bound")
}

fn assert_bound_error(result: qkv::Result<String>, what: &str) {
    match result {
        Err(Error::ChatTemplate { template, msg }) => {
            assert_eq!(template, "hostile");
            assert!(msg.contains(what), "{msg}");
        }
        Err(other) => panic!("expected a chat template error about {what}, got {other}"),
        Ok(text) => panic!("a hostile template rendered {} bytes", text.len()),
    }
}

#[test]
fn a_template_looping_for_ever_runs_out_of_fuel() {
    // Ten billion empty iterations: no output and no data, only instructions.
    let r = render_within_a_minute(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    );
    assert_bound_error(r, "fuel");
}

#[test]
fn a_template_doubling_a_string_runs_out_of_fuel_before_memory() {
    // 2^60 bytes if nothing stopped it.
    let r = render_within_a_minute(
        "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}\
         {% endfor %}{{ ns.s | length }}",
    );
    assert_bound_error(r, "fuel");
}

/// Found by the `template` target after 8.5 million executions: `range(1) * 20000100`.
/// minijinja repeated a list lazily and charged no fuel for it, so one instruction stood for
/// up to 100 million items that every later walk (printing it, indexing it from the end,
/// `~`, `| string`) visited in full: 47 s for this input in the fuzzing build.
///
/// Lists repeat eagerly now, charged like any list they build (third_party/minijinja).
#[test]
fn a_template_repeating_a_list_millions_of_times_runs_out_of_fuel() {
    for source in [
        "{{ range(1)* 020000100 }}",
        "{{ (range(1) * 100000000)[-1] }}",
        "{{ ([0] * 99999999) ~ '' }}",
        "{{ ((1,) * 90000000) | last }}",
        "{% for x in [0] * 99999999 %}{% endfor %}",
    ] {
        assert_bound_error(render_within_a_minute(source), "fuel");
    }
    // Small repetitions stay what Python makes of them.
    let r = render_within_a_minute("{{ [1, 2] * 2 }}{{ (1,) * 2 }}{{ [] * 3 }}{{ [1] * -1 }}");
    assert_eq!(
        r.expect("small repetitions render"),
        "[1, 2, 1, 2](1, 1)[][]"
    );
}

/// A list shared by reference: forty doublings build `[x, x]` nested forty times, 2^40 items
/// in forty lists and little fuel. Every walk over it (formatting, `| string`, `~`, `tojson`,
/// `pprint`, comparing, sorting, hashing it as a key) ran for hours.
///
/// Walks charge the items they visit to the fuel (third_party/minijinja), and `tojson`
/// bounds its text.
#[test]
fn walks_over_a_shared_list_run_out_of_fuel() {
    let build = "{% set ns = namespace(x=[0], y=[0]) %}{% for i in range(40) %}\
                 {% set ns.x = [ns.x, ns.x] %}{% set ns.y = [ns.y, ns.y] %}{% endfor %}";
    for (walk, bound) in [
        ("{{ ns.x | string | length }}", "fuel"),
        ("{{ (ns.x ~ '') | length }}", "fuel"),
        ("{{ ns.x | join | length }}", "fuel"),
        ("{{ ns.x | pprint | length }}", "fuel"),
        ("{{ ns.x == ns.y }}", "fuel"),
        ("{{ [ns.x, ns.y] | sort | length }}", "fuel"),
        ("{{ [ns.x, ns.y] | unique | list | length }}", "fuel"),
        ("{{ {ns.x: 1} | length }}", "fuel"),
        ("{{ ns.x | tojson | length }}", "4194304 bytes"),
    ] {
        let source: &'static str = format!("{build}{walk}").leak();
        assert_bound_error(render_within_a_minute(source), bound);
    }
    // Printed, it meets the output bound and the fuel at about the same item: either stops it.
    let source: &'static str = format!("{build}{{{{ ns.x }}}}").leak();
    match render_within_a_minute(source) {
        Err(Error::ChatTemplate { msg, .. })
            if msg.contains("fuel") || msg.contains(&MAX_TEMPLATE_OUTPUT.to_string()) => {}
        other => panic!("expected the fuel or the output bound to stop it, got {other:?}"),
    }
}

/// A list nested in a list a million times (the fuel allows that many levels) overflowed the
/// stack when minijinja dropped it, and when formatting, comparing or serializing it: a crash.
///
/// Dropping is iterative, walks stop at 1,000 levels (Python's recursion limit), as `tojson`
/// does, and the render runs on a thread of its own with room for the rest.
#[test]
fn a_list_nested_a_million_levels_deep_is_an_error_not_a_stack_overflow() {
    let deepest = |body: &str| -> &'static str {
        format!(
            "{{% set ns = namespace(x=[], y=[]) %}}{{% for i in range(1000) %}}\
             {{% for j in range(1000) %}}{body}{{% endfor %}}{{% endfor %}}"
        )
        .leak()
    };
    // Each runs out of fuel while building, then drops what it built.
    for body in [
        "{% set ns.x = [ns.x] %}",
        "{% set ns.x = [[[[[[[[[[ns.x]]]]]]]]]] %}",
        "{% set ns.x = {'a': ns.x} %}",
        "{% set ns.x = (ns.x,) %}",
        "{% set ns.x = namespace(y=ns.x) %}",
    ] {
        assert_bound_error(render_within_a_minute(deepest(body)), "fuel");
    }
    let deep = "{% set ns = namespace(x=[], y=[]) %}{% for i in range(100000) %}\
                {% set ns.x = [ns.x] %}{% set ns.y = [ns.y] %}{% endfor %}";
    for (walk, bound) in [
        ("{{ ns.x }}", "fuel"),
        ("{{ ns.x | string | length }}", "fuel"),
        ("{{ ns.x == ns.y }}", "fuel"),
        ("{{ [ns.x, ns.y, ns.x] | sort | length }}", "fuel"),
        ("{{ ns.x | tojson }}", "nested deeper than 1000 levels"),
    ] {
        let source: &'static str = format!("{deep}{walk}").leak();
        assert_bound_error(render_within_a_minute(source), bound);
    }
    // 999 levels are still a value like any other.
    let r = render_within_a_minute(
        "{% set ns = namespace(x=[]) %}{% for i in range(998) %}{% set ns.x = [ns.x] %}\
         {% endfor %}{{ ns.x | string | length }} {{ ns.x | tojson | length }}",
    );
    assert_eq!(r.expect("999 levels render"), "1998 1998");
}

/// Found by reading the parser after the walks above: unary minuses (or `not`s, or `else`s
/// of inline ifs) recursed once each with no bound (fifty thousand overflowed a 2 MB stack and
/// aborted the process); chains that the parser builds in a loop (`x.x.x…`, `f()()…`, `1 + 1 + …`,
/// `x|list|list…`) made a tree as deep as the source is long, which compiling and dropping
/// then walked recursively.
///
/// The parser counts unary operators and inline `else`s against its nesting limit, constant
/// folding is bounded (both in third_party/minijinja), a source may take MAX_TEMPLATE_SOURCE
/// bytes, and the longest chains that fit compile and drop on the render's thread.
#[test]
fn deeply_nested_or_chained_sources_are_errors_not_stack_overflows() {
    let render = |source: String| {
        ChatTemplate::new("hostile", source).render(
            &[json!({"role": "user", "content": "hi"})],
            &ChatOptions::default(),
        )
    };
    for (open, close) in [
        ("-", ""),
        ("not ", ""),
        ("1 if 0 else ", ""),
        ("[", "]"),
        ("(", ")"),
    ] {
        let n = (MAX_TEMPLATE_SOURCE - 16) / (open.len() + close.len());
        let source = format!("{{{{ {}1{} }}}}", open.repeat(n), close.repeat(n));
        match render(source) {
            Err(Error::ChatTemplate { msg, .. }) => assert!(msg.contains("recursion"), "{msg}"),
            other => panic!("{open:?} × {n}: {other:?}"),
        }
    }
    // Chains as long as the bound allows (the last link may not fit: leave room for it).
    // Constant folding looked at each link's whole chain: `x + 1 + …` at this length compiled
    // in six minutes; it now looks at 256 nodes at most.
    for link in [
        ".x", "()", " + 1", "|list", "[0]", " ~ 'a'", " and 1", " or 1",
    ] {
        let n = (MAX_TEMPLATE_SOURCE - 16) / link.len();
        let source: &'static str = format!("{{{{ x{} }}}}", link.repeat(n)).leak();
        assert!(source.len() <= MAX_TEMPLATE_SOURCE);
        // Undefined values, unknown functions or text: anything but a crash or a hang.
        let _ = render_within_a_minute(source);
    }
    // One byte past the bound is refused before it is parsed.
    let source = "x".repeat(MAX_TEMPLATE_SOURCE + 1);
    match render(source) {
        Err(Error::ChatTemplate { msg, .. }) => {
            assert!(msg.contains(&MAX_TEMPLATE_SOURCE.to_string()), "{msg}")
        }
        other => panic!("{other:?}"),
    }
}

/// `tojson(indent=N)` allocated N spaces up front: a capacity overflow panic for a huge N.
#[test]
fn a_huge_tojson_indent_is_an_error() {
    for source in [
        "{{ [1] | tojson(indent=99999999999) }}",
        "{{ [[[[[[[[[[1]]]]]]]]]] | tojson(indent=3000000) }}",
    ] {
        assert_bound_error(render_within_a_minute(source), "4194304 bytes");
    }
}

#[test]
fn a_template_writing_gigabytes_stops_at_the_output_bound() {
    // 10 GB of output, 100 KB per write.
    let r = render_within_a_minute("{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}");
    assert_bound_error(r, &MAX_TEMPLATE_OUTPUT.to_string());
}

#[test]
fn a_template_just_under_the_output_bound_renders() {
    // 1 MB: a long prompt, far under both bounds.
    let r = render_within_a_minute("{% for i in range(1000) %}{{ 'y' * 1000 }}{% endfor %}");
    assert_eq!(r.expect("a 1 MB prompt renders").len(), 1_000_000);
}

#[test]
fn a_long_conversation_stays_within_the_bounds() {
    // 5,000 turns of 200 characters through ChatML: a real prompt of 1 MB, far from the fuel
    // budget; the bounds must never refuse an honest conversation.
    let messages: Vec<_> = (0..5000)
        .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": "z".repeat(200)}))
        .collect();
    let text = ChatTemplate::chatml()
        .render(&messages, &ChatOptions::default())
        .expect("a long conversation renders");
    assert!(text.len() > 5000 * 200, "{}", text.len());
}

/// Found by the `gguf` target (minimized by hand): a GGUF file whose one tensor `z` is F32 of
/// GGUF shape [2^38, 0], so no elements and no bytes, in rows of 2^38 elements. It parses and
/// loads (rightly: it is empty), but `Tensor::into_dtype(F16)` sized its scratch buffer by
/// the row, one row of 2^38 f32 (1 TiB), and the allocation aborted the process.
///
/// The scratch of `Tensor::into_dtype` is no longer than the tensor.
#[test]
fn an_empty_tensor_of_long_rows_converts_without_allocating_its_row() {
    #[rustfmt::skip]
    let mut bytes: Vec<u8> = vec![
        b'G', b'G', b'U', b'F', 3, 0, 0, 0,     // magic, version 3
        1, 0, 0, 0, 0, 0, 0, 0,                 // one tensor
        0, 0, 0, 0, 0, 0, 0, 0,                 // no metadata
        1, 0, 0, 0, 0, 0, 0, 0, b'z',           // name "z"
        2, 0, 0, 0,                             // two dimensions
        0, 0, 0, 0, 0x40, 0, 0, 0,              // ne[0] = 2^38 (the row)
        0, 0, 0, 0, 0, 0, 0, 0,                 // ne[1] = 0 rows
        0, 0, 0, 0,                             // F32
        0, 0, 0, 0, 0, 0, 0, 0,                 // data offset 0
    ];
    bytes.resize(96, 0); // the data section starts at the next multiple of 32
    let dir = std::env::temp_dir().join(format!("qkv-fuzz-regressions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("empty-long-rows.gguf");
    std::fs::write(&path, &bytes).unwrap();

    let file = GgufFile::open(&path).expect("an empty tensor is a valid file");
    let t = file.tensor("z").expect("it loads");
    assert_eq!((t.shape(), t.numel()), (&[0, 1usize << 38][..], 0));
    let h = t
        .into_dtype(FloatType::F16)
        .expect("an empty tensor converts");
    assert_eq!(h.numel(), 0);
    std::fs::remove_dir_all(&dir).ok();
}

/// Found by the `template` target within seconds (minimized by hand): a `{%` whose `%` also
/// starts a `%}`, in a template that mentions `generation`. The rewrite of transformers'
/// `{% generation %}` tags took the overlapping `%}` for the tag's end and sliced backwards
/// (`byte range starts at 2 but ends at 1`): a panic on a model file's template.
#[test]
fn a_tag_opener_overlapping_its_closer_is_a_template_error() {
    for source in [
        "{%}generation",
        "{%}{% generation %}x{% endgeneration %}",
        "a{%}",
    ] {
        let r = ChatTemplate::new("hostile", source).render(
            &[json!({"role": "user", "content": "hi"})],
            &ChatOptions::default(),
        );
        assert!(
            matches!(r, Err(Error::ChatTemplate { .. })),
            "{source:?}: {r:?}"
        );
    }
}
