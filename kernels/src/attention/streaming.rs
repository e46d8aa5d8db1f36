//! Temporary: a row-at-a-time online softmax; replaced by the blocked kernel.
use super::{AttentionMask, Dims, KvView, QueryView};

pub(super) fn run(q: &QueryView<'_>, k: &KvView<'_>, v: &KvView<'_>, mask: &AttentionMask<'_>, dims: &Dims, out: &mut [f32]) {
    let group = dims.heads / dims.kv_heads;
    for i in 0..dims.tq {
        for h in 0..dims.heads {
            let g = h / group;
            let o = &mut out[(i * dims.heads + h) * dims.d_v..][..dims.d_v];
            o.fill(0.0);
            let (mut m, mut l) = (f32::NEG_INFINITY, 0.0f32);
            for j in 0..dims.tk {
                if !mask.visible(i, j, dims.tk) { continue; }
                let mut s = 0.0;
                for d in 0..dims.d_qk { s += q.data[i * q.row_stride + h * q.head_stride + d] * k.get(j, g, d); }
                s *= dims.scale;
                let mn = m.max(s);
                let c = (m - mn).exp();
                let p = (s - mn).exp();
                l = l * c + p;
                for (d, od) in o.iter_mut().enumerate() { *od = *od * c + p * v.get(j, g, d); }
                m = mn;
            }
            if l > 0.0 { for od in o.iter_mut() { *od /= l; } }
        }
    }
}
