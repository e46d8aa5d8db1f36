//! The `qkv-server` client of the server tests (server/tests/server*.rs): a server process on a
//! free loopback port, and a few lines of HTTP/1.1 over `TcpStream`, so that what
//! is tested is the bytes on the wire; scratch directories, the 401 check, and a reader of
//! `/metrics` that checks the exposition's format.

#![allow(dead_code)]

use qkv::kernels::QuantFormat;
use qkv::testing::synthetic::{self, Storage};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A server process on a free loopback port, killed on drop.
pub struct Server {
    /// `None` for a client of a server owned elsewhere ([`Server::attach`]).
    pub child: Option<Child>,
    pub port: u16,
    /// Sent as `Authorization: Bearer …` with every request, when set.
    pub key: Option<String>,
}

/// The synthetic model the offline tests serve (Q4_K blocks).
pub fn synthetic_model() -> PathBuf {
    synthetic::model_file(Storage::Quant(QuantFormat::Q4_K))
}

impl Server {
    /// A server of the default model, or `None` (a skip printed) without it.
    pub fn start(extra: &[&str]) -> Option<Server> {
        Some(Server::start_with(
            &qkv_fetch::testing::default_gguf()?,
            extra,
        ))
    }

    /// A server of the synthetic model.
    pub fn start_synthetic(extra: &[&str]) -> Server {
        Server::start_with(&synthetic_model(), extra)
    }

    /// A server of `model` named `smollm2`, with a context of 512, and `extra`.
    pub fn start_with(model: &Path, extra: &[&str]) -> Server {
        let model = model.to_str().unwrap();
        let args = [
            &["--model", model, "--ctx", "512", "--model-name", "smollm2"],
            extra,
        ]
        .concat();
        Server::spawn(&args).unwrap_or_else(|e| panic!("the server exited: {e}"))
    }

    /// A server with exactly `args` (and `--port 0`), or what it printed on stderr when it
    /// exited before listening.
    pub fn spawn(args: &[&str]) -> Result<Server, String> {
        Server::spawn_env(args, &[]).map(|(s, _)| s)
    }

    /// A server with exactly `args` (and `--port 0`) and the variables `env`, and what it
    /// printed on stderr up to its listening line; or all it printed when it exited first.
    pub fn spawn_env(args: &[&str], env: &[(&str, &str)]) -> Result<(Server, String), String> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_qkv-server"))
            .args(["--port", "0"])
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        let mut said = String::new();
        let port = loop {
            line.clear();
            if err.read_line(&mut line).unwrap_or(0) == 0 {
                child.wait().ok();
                return Err(said);
            }
            said.push_str(&line);
            if let Some(at) = line.find("listening on http://127.0.0.1:") {
                let p = &line[at + "listening on http://127.0.0.1:".len()..];
                break p.trim().parse().unwrap();
            }
        };
        // Keep draining stderr so that the server never blocks on it.
        std::thread::spawn(move || {
            let mut sink = String::new();
            while err.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
                sink.clear();
            }
        });
        Ok((
            Server {
                child: Some(child),
                port,
                key: None,
            },
            said,
        ))
    }

    /// A client of a server started elsewhere (the process is not owned).
    pub fn attach(port: u16) -> Server {
        Server {
            child: None,
            port,
            key: None,
        }
    }

    /// A client of the same server that sends `key` (or none).
    pub fn with_key(&self, key: Option<&str>) -> Server {
        Server {
            child: None,
            port: self.port,
            key: key.map(str::to_owned),
        }
    }

    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        s
    }

    /// Sends a request and returns the stream, positioned after the response headers, with
    /// the status and whether the body is chunked.
    pub fn send(&self, method: &str, path: &str, body: &[u8]) -> (u16, bool, BufReader<TcpStream>) {
        let mut s = self.connect();
        let auth = match &self.key {
            Some(k) => format!("Authorization: Bearer {k}\r\n"),
            None => String::new(),
        };
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             {auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .unwrap();
        s.write_all(body).unwrap();
        let mut r = BufReader::new(s);
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let status: u16 = line.split(' ').nth(1).unwrap().parse().unwrap();
        let mut chunked = false;
        loop {
            line.clear();
            r.read_line(&mut line).unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if line
                .to_ascii_lowercase()
                .starts_with("transfer-encoding: chunked")
            {
                chunked = true;
            }
        }
        (status, chunked, r)
    }

    /// A whole request: status and body.
    pub fn call(&self, method: &str, path: &str, body: &Value) -> (u16, String) {
        self.call_raw(method, path, body.to_string().as_bytes())
    }

    pub fn call_raw(&self, method: &str, path: &str, body: &[u8]) -> (u16, String) {
        let (status, chunked, mut r) = self.send(method, path, body);
        let mut out = Vec::new();
        if chunked {
            while let Some(c) = next_chunk(&mut r) {
                out.extend(c);
            }
        } else {
            r.read_to_end(&mut out).unwrap();
        }
        (status, String::from_utf8(out).unwrap())
    }

    pub fn json(&self, path: &str, body: &Value) -> Value {
        let (status, text) = self.call("POST", path, body);
        assert_eq!(status, 200, "{path}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// A GET's status and body.
    pub fn get(&self, path: &str) -> (u16, String) {
        self.call_raw("GET", path, b"")
    }

    /// A streamed request: the SSE reader.
    pub fn stream(&self, path: &str, body: &Value) -> Sse {
        let (status, chunked, r) = self.send("POST", path, body.to_string().as_bytes());
        assert_eq!((status, chunked), (200, true));
        Sse {
            r,
            buf: String::new(),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            c.kill().ok();
            c.wait().ok();
        }
    }
}

/// One chunk of a chunked body; `None` at the end.
pub fn next_chunk(r: &mut BufReader<TcpStream>) -> Option<Vec<u8>> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let n = usize::from_str_radix(line.trim(), 16).ok()?;
    let mut data = vec![0; n + 2];
    r.read_exact(&mut data).ok()?;
    data.truncate(n);
    (n > 0).then_some(data)
}

/// Server-sent events of a chunked response.
pub struct Sse {
    r: BufReader<TcpStream>,
    buf: String,
}

impl Sse {
    /// The next `data:` payload; `None` when the stream ends.
    pub fn next(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let event: String = self.buf.drain(..end + 2).collect();
                if let Some(data) = event.trim().strip_prefix("data: ") {
                    return Some(data.to_owned());
                }
                continue;
            }
            let chunk = next_chunk(&mut self.r)?;
            self.buf.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }

    /// Every chunk's JSON until `[DONE]` (which must come).
    pub fn all(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            match self.next().as_deref() {
                Some("[DONE]") => return out,
                Some(d) => out.push(serde_json::from_str(d).unwrap()),
                None => panic!("the stream ended without [DONE]"),
            }
        }
    }
}

/// A directory removed on drop.
pub struct ScratchDir(pub PathBuf);

impl ScratchDir {
    pub fn new(tag: &str) -> ScratchDir {
        let dir = std::env::temp_dir().join(format!("qkv-server-api-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        ScratchDir(dir)
    }

    pub fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.0.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, bytes).unwrap();
        path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

/// The synthetic model's path as an argument.
pub fn synthetic() -> String {
    synthetic_model().to_str().unwrap().to_owned()
}

/// The 401 of `r`, in OpenAI's shape.
pub fn assert_401(r: (u16, String), what: &str) {
    assert_eq!(r.0, 401, "{what}: {}", r.1);
    let e: Value = serde_json::from_str(&r.1).unwrap();
    assert_eq!(e["error"]["type"], "authentication_error", "{what}");
    assert_eq!(e["error"]["code"], "invalid_api_key", "{what}");
    assert!(e["error"]["message"].is_string(), "{what}");
}

/// A sample line of `/metrics`: its value, checking the whole exposition on the way (every
/// sample's family has HELP and TYPE lines before it, names are valid, values are numbers).
pub fn metric(text: &str, name: &str) -> f64 {
    let valid_name = |n: &str| {
        !n.is_empty()
            && n.chars().enumerate().all(|(i, c)| {
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
            })
    };
    let mut typed: Vec<String> = Vec::new();
    let mut helped: Vec<String> = Vec::new();
    let mut found = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let n = rest.split(' ').next().unwrap();
            assert!(valid_name(n), "{line}");
            helped.push(n.to_owned());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            let n = parts.next().unwrap();
            let kind = parts.next().unwrap();
            assert!(
                ["counter", "gauge", "histogram", "summary"].contains(&kind),
                "{line}"
            );
            assert!(
                helped.last().map(String::as_str) == Some(n),
                "TYPE without HELP: {line}"
            );
            typed.push(n.to_owned());
        } else {
            assert!(!line.starts_with('#') && !line.is_empty(), "{line:?}");
            let (series, value) = line.rsplit_once(' ').unwrap();
            let n = series.split('{').next().unwrap();
            assert!(valid_name(n), "{line}");
            let family = typed
                .last()
                .unwrap_or_else(|| panic!("a sample before any TYPE: {line}"));
            assert!(n.starts_with(family.as_str()), "{line} under {family}");
            let v: f64 = value.parse().unwrap_or_else(|_| panic!("{line}"));
            if series == name || (n == name && series.contains('{') && !name.contains('{')) {
                found = Some(v);
            }
        }
    }
    found.unwrap_or_else(|| panic!("{name} is missing from /metrics:\n{text}"))
}
