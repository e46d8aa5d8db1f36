//! [`MoeBlock::forward`]: a pass of the mixture-of-experts block, as its steps: route every
//! row, group the rows by expert, run each chosen expert on its rows, combine each row's
//! expert outputs by their weights, and add the shared expert.

use super::{route, GatedMlp, MoeBlock, MoeScratch};
use crate::error::{Error, Result};
use crate::models::decoder::config::Moe;
use qkv_kernels::activation::swiglu;
use qkv_kernels::linear_many;
use rayon::prelude::*;

/// One expert's share of a pass: its rows' inputs (then outputs) and scratch.
struct Task<'a> {
    expert: usize,
    rows: usize,
    xo: &'a mut [f32],
    gate: &'a mut [f32],
    up: &'a mut [f32],
    hidden: &'a mut [f32],
}

impl MoeBlock {
    /// The block over `t` rows of `xn` (`[t, dim]`, normalised), into `s.acc[..t·dim]`.
    /// `gate`, `up` and `hidden` are scratch of [`super::ffn_elems`] elements.
    pub(in crate::models::decoder) fn forward(
        &self,
        m: &Moe,
        xn: &[f32],
        t: usize,
        d: usize,
        s: &mut MoeScratch,
        [gate, up, hidden]: [&mut [f32]; 3],
    ) -> Result<()> {
        let pairs = t * m.used;
        if xn.len() != t * d
            || s.xo.len() < pairs * d
            || s.acc.len() < t * d
            || [gate.len(), up.len(), hidden.len()]
                .iter()
                .any(|&l| l < pairs * m.expert_ffn)
        {
            return Err(Error::Shape(format!(
                "expert scratch too small for a pass of {t} positions"
            )));
        }
        self.route_rows(m, xn, t, s)?;
        group_by_expert(m, t, s);
        self.run_experts(m, xn, t, d, s, [gate, &mut *up, &mut *hidden])?;
        combine(m, t, d, s);
        if let Some(shared) = &self.shared {
            add_shared(shared, m, xn, t, d, s, [gate, up, hidden])?;
        }
        Ok(())
    }

    /// Each row's experts and weights, in `s.chosen`.
    fn route_rows(&self, m: &Moe, xn: &[f32], t: usize, s: &mut MoeScratch) -> Result<()> {
        let (ne, k) = (m.experts, m.used);
        let probs = &mut s.probs[..t * ne];
        self.router.forward_into(xn, t, probs)?;
        let chosen = &mut s.chosen[..t * k];
        for (p, pick) in probs.chunks_exact_mut(ne).zip(chosen.chunks_exact_mut(k)) {
            route(p, pick, m.norm_topk);
        }
        Ok(())
    }

    /// Every chosen expert over its rows: each expert's rows gathered into its part of
    /// `s.xo` and scratch (cut in expert order), the experts run side by side, each output
    /// left where its inputs were.
    fn run_experts(
        &self,
        m: &Moe,
        xn: &[f32],
        t: usize,
        d: usize,
        s: &mut MoeScratch,
        [gate, up, hidden]: [&mut [f32]; 3],
    ) -> Result<()> {
        let (ne, ff, pairs) = (m.experts, m.expert_ffn, t * m.used);
        let (starts, order) = (&s.starts, &s.order[..pairs]);
        let mut tasks = Vec::with_capacity(ne.min(pairs));
        let (mut xo, mut g, mut u, mut h) = (
            &mut s.xo[..pairs * d],
            &mut gate[..pairs * ff],
            &mut up[..pairs * ff],
            &mut hidden[..pairs * ff],
        );
        for x in 0..ne {
            let n = starts[x + 1] - starts[x];
            if n == 0 {
                continue;
            }
            let (a, rest) = std::mem::take(&mut xo).split_at_mut(n * d);
            xo = rest;
            let (gx, rest) = std::mem::take(&mut g).split_at_mut(n * ff);
            g = rest;
            let (ux, rest) = std::mem::take(&mut u).split_at_mut(n * ff);
            u = rest;
            let (hx, rest) = std::mem::take(&mut h).split_at_mut(n * ff);
            h = rest;
            if n < t {
                for (dst, &(r, _)) in a.chunks_exact_mut(d).zip(&order[starts[x]..starts[x + 1]]) {
                    let r = r as usize;
                    dst.copy_from_slice(&xn[r * d..(r + 1) * d]);
                }
            }
            tasks.push(Task {
                expert: x,
                rows: n,
                xo: a,
                gate: gx,
                up: ux,
                hidden: hx,
            });
        }
        self.run_tasks(xn, t, d, &mut tasks)
    }

    /// The experts side by side on the threads, the largest first (each product still
    /// splits across idle threads); an expert that every row chose reads `xn` itself.
    fn run_tasks(&self, xn: &[f32], t: usize, d: usize, tasks: &mut [Task<'_>]) -> Result<()> {
        tasks.sort_by_key(|task| std::cmp::Reverse(task.rows));
        let experts = &self.experts;
        let run = |task: &mut Task<'_>| -> Result<()> {
            let Task {
                expert,
                rows,
                xo,
                gate,
                up,
                hidden,
            } = task;
            if *rows == t {
                experts.run(
                    *expert,
                    xn,
                    t,
                    d,
                    [&mut **gate, &mut **up, &mut **hidden],
                    xo,
                )
            } else {
                // The gathered rows are read by gate and up before down overwrites them.
                experts.gate_up(*expert, xo, *rows, d, gate, up)?;
                swiglu(hidden, gate, up)?;
                experts.down.forward(*expert, hidden, *rows, xo)
            }
        };
        if tasks.len() == 1 {
            run(&mut tasks[0])
        } else {
            tasks.par_iter_mut().with_max_len(1).try_for_each(run)
        }
    }
}

/// Groups the rows' choices by expert (a counting sort, rows ascending within each expert)
/// into `s.order`, each expert's run starting at `s.starts[expert]`, remembering in
/// `s.slot` where each row's choice went.
fn group_by_expert(m: &Moe, t: usize, s: &mut MoeScratch) {
    let (ne, k) = (m.experts, m.used);
    let chosen = &s.chosen[..t * k];
    let starts = &mut s.starts;
    starts.fill(0);
    for &(x, _) in chosen.iter() {
        starts[x as usize + 1] += 1;
    }
    for x in 0..ne {
        starts[x + 1] += starts[x];
    }
    let next = &mut s.cursor;
    next.copy_from_slice(&starts[..ne]);
    let order = &mut s.order[..t * k];
    let slot = &mut s.slot[..t * k];
    for (r, (pick, slots)) in chosen
        .chunks_exact(k)
        .zip(slot.chunks_exact_mut(k))
        .enumerate()
    {
        for (&(x, w), at) in pick.iter().zip(slots) {
            let p = next[x as usize];
            order[p] = (r as u32, w);
            *at = p as u32;
            next[x as usize] += 1;
        }
    }
}

/// Each row of `s.acc`: its experts' outputs with their weights.
fn combine(m: &Moe, t: usize, d: usize, s: &mut MoeScratch) {
    let k = m.used;
    let (xo, slot, chosen) = (&s.xo[..t * k * d], &s.slot, &s.chosen);
    let combine = |(r, a): (usize, &mut [f32])| {
        a.fill(0.0);
        for (&p, &(_, w)) in slot[r * k..(r + 1) * k]
            .iter()
            .zip(&chosen[r * k..(r + 1) * k])
        {
            let p = p as usize;
            a.iter_mut()
                .zip(&xo[p * d..(p + 1) * d])
                .for_each(|(a, v)| *a += w * v);
        }
    };
    let acc = &mut s.acc[..t * d];
    if t >= 16 {
        acc.par_chunks_mut(d).enumerate().for_each(combine);
    } else {
        acc.chunks_mut(d).enumerate().for_each(combine);
    }
}

/// Adds the shared expert's output, scaled per row by the sigmoid of its gate row, to
/// `s.acc`.
fn add_shared(
    (shared, gate_row): &(GatedMlp, Vec<f32>),
    m: &Moe,
    xn: &[f32],
    t: usize,
    d: usize,
    s: &mut MoeScratch,
    [gate, up, hidden]: [&mut [f32]; 3],
) -> Result<()> {
    let sf = m.shared_ffn.unwrap_or(0);
    let (g, u, h) = (
        &mut gate[..t * sf],
        &mut up[..t * sf],
        &mut hidden[..t * sf],
    );
    linear_many(
        xn,
        t,
        d,
        &mut [shared.gate.projection(g), shared.up.projection(u)],
    )?;
    swiglu(h, g, u)?;
    let out = &mut s.out[..t * d];
    shared.down.forward_into(h, t, out)?;
    for ((a, o), x) in s.acc[..t * d]
        .chunks_exact_mut(d)
        .zip(out.chunks_exact(d))
        .zip(xn.chunks_exact(d))
    {
        let logit: f32 = x.iter().zip(gate_row).map(|(a, b)| a * b).sum();
        let g = 1.0 / (1.0 + (-logit).exp());
        a.iter_mut().zip(o.iter()).for_each(|(a, v)| *a += g * v);
    }
    Ok(())
}
