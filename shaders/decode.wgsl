// decode.wgsl: the attention half of a decoder's step for one new token a sequence, over a
// key/value cache.
//
// Sizes: n sequences stepping together (rows of the step); H query heads and KV key/value
// heads of HD dimensions (a query head h reads key/value head h / (H / KV)); the cache of a
// layer is [B, KV, cap, HD] for keys and the same for values. `ps` (u32 [2 n]) holds each
// row's position (its new token's place, the cache length before the step) then its cache
// row.
//
//   rope_write  One thread per (row i, head of q, k and v, pair j < HD / 2): reads the fused
//               projection qkv [n, (H + 2 KV) HD] (q heads, k heads, v heads), rotates q and
//               k by the angles of position ps[i] (tables cos, sin [positions, HD / 2], f32;
//               the pair is (j, j + HD / 2), Hugging Face's rotate_half convention), writes q
//               [n, H HD] and the new key and value into the cache at that position.
//   attend      One workgroup per (row i, head h, split s): attention of q[i, h] over the
//               positions [s span, min((s + 1) span, ps[i] + 1)) of the row's cache, in chunks
//               of WG positions: each thread scores one position (q . k / sqrt(HD) in f32),
//               the chunk's maximum and the exponentials' sum update the running (max, sum)
//               as in flash attention, and each thread accumulates its HD / WG output
//               dimensions over the chunk's positions (consecutive threads read consecutive
//               values of a cached row). With one split it writes o [n, H HD]; with several,
//               each writes (max, sum, acc[HD]) to `part` and `combine` merges them
//               (flash-decoding: a long cache spread over more workgroups).
//   combine     One workgroup per (i, h), a thread per dimension: the splits' partial results
//               rescaled to their common maximum, summed and normalised.
//
// Bindings: signature lines (part is a dummy with one split). Params: n, heads, kv_heads,
// hd, cap, span, nsplit, scale (1 / sqrt(hd)).
// Loops (per invocation): rope_write none; attend span / WG chunks of (HD / 4 + ND WG + 2
// reductions) plus HD / WG to load q; combine 2 nsplit. The host keeps them in the budget.
// Bounds: rope_write threads past the end return; attend's chunk loop bounds are the same for
// the whole workgroup (uniform for its barriers) and positions past the row's end score
// -inf and add nothing; combine's threads past HD return after the loops.

struct Params {
  n: u32,
  heads: u32,
  kv_heads: u32,
  hd: u32,
  cap: u32,
  span: u32,
  nsplit: u32,
  scale: f32,
}

const NEG: f32 = -3.0e38;

//! entry rope_write(qkv: data, cos: f32, sin: f32, ps: u32, q: data mut, kc: data mut, vc: data mut)
//! check WG=64
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let t = flat_id(ids);
  let half = p.hd / 2u;
  let nh = p.heads + 2u * p.kv_heads;
  if (t >= p.n * nh * half) { return; }
  let j = t % half;
  let head = (t / half) % nh;
  let i = t / (half * nh);
  let pos = ld_ps(i);
  let row = ld_ps(p.n + i);
  let src = (i * nh + head) * p.hd + j;
  let a = ld_qkv(src);
  let b = ld_qkv(src + half);
  if (head >= p.heads + p.kv_heads) {
    let at = ((row * p.kv_heads + head - p.heads - p.kv_heads) * p.cap + pos) * p.hd + j;
    st_vc(at, a);
    st_vc(at + half, b);
    return;
  }
  let c = ld_cos(pos * half + j);
  let s = ld_sin(pos * half + j);
  let ra = a * c - b * s;
  let rb = b * c + a * s;
  if (head < p.heads) {
    let at = (i * p.heads + head) * p.hd + j;
    st_q(at, ra);
    st_q(at + half, rb);
  } else {
    let at = ((row * p.kv_heads + head - p.heads) * p.cap + pos) * p.hd + j;
    st_kc(at, ra);
    st_kc(at + half, rb);
  }
}

//! entry attend(q: data, kc: data vec4, vc: data, ps: u32, part: f32 mut, o: data mut)
//! check WG=64 HD=16,64,128,256
// Output dimensions a thread accumulates.
const ND: u32 = (HD + WG - 1u) / WG;
var<workgroup> qsh: array<f32, HD>;
var<workgroup> esh: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let g = ids.wid.y * ids.nwg.x + ids.wid.x;
  let s = g % p.nsplit;
  let h = (g / p.nsplit) % p.heads;
  let i = g / (p.nsplit * p.heads);
  if (i >= p.n) { return; }
  let pos = ld_ps(i);
  let row = ld_ps(p.n + i);
  let kvh = h / (p.heads / p.kv_heads);
  let len = pos + 1u;
  let start = s * p.span;
  let end = min(start + p.span, len);
  for (var d = ids.lid; d < HD; d = d + WG) {
    qsh[d] = ld_q((i * p.heads + h) * HD + d) * p.scale;
  }
  workgroupBarrier();
  let base = (row * p.kv_heads + kvh) * p.cap;
  var m = NEG;
  var l = 0.0;
  var acc: array<f32, ND>;
  for (var c0 = start; c0 < end; c0 = c0 + WG) {
    let at = c0 + ids.lid;
    var score = NEG;
    if (at < end) {
      var sc = 0.0;
      for (var d4 = 0u; d4 < HD / 4u; d4 = d4 + 1u) {
        let k = ld4_kc(((base + at) * HD) / 4u + d4);
        sc = sc + dot(k, vec4<f32>(qsh[4u * d4], qsh[4u * d4 + 1u], qsh[4u * d4 + 2u], qsh[4u * d4 + 3u]));
      }
      score = sc;
    }
    let mn = max(m, block_max(score, ids));
    let alpha = exp(m - mn);
    var e = 0.0;
    if (at < end) { e = exp(score - mn); }
    l = l * alpha + block_sum(e, ids);
    m = mn;
    esh[ids.lid] = e;
    workgroupBarrier();
    // Positions past the end have weight 0 and read the last row (in bounds): a loop of
    // constant length the compiler can unroll, its loads independent of the sums.
    let last = end - 1u;
    for (var k = 0u; k < ND; k = k + 1u) {
      let d = min(ids.lid + k * WG, HD - 1u);
      var a = acc[k] * alpha;
      for (var jj = 0u; jj < WG; jj = jj + 1u) {
        a = a + esh[jj] * ld_vc((base + min(c0 + jj, last)) * HD + d);
      }
      acc[k] = a;
    }
  }
  for (var k = 0u; k < ND; k = k + 1u) {
    let d = ids.lid + k * WG;
    if (d < HD) {
      if (p.nsplit == 1u) {
        st_o((i * p.heads + h) * HD + d, acc[k] / l);
      } else {
        let at = ((i * p.heads + h) * p.nsplit + s) * (HD + 2u);
        st_part(at + 2u + d, acc[k]);
        if (d == 0u) {
          st_part(at, m);
          st_part(at + 1u, l);
        }
      }
    }
  }
}

//! entry combine(part: f32, o: data mut)
//! check WG=64,128,256
@compute @workgroup_size(WG)
fn main(ids: Ids) {
  let g = ids.wid.y * ids.nwg.x + ids.wid.x;
  if (g >= p.n * p.heads) { return; }
  let stride = p.hd + 2u;
  let first = g * p.nsplit * stride;
  var mx = NEG;
  for (var s = 0u; s < p.nsplit; s = s + 1u) { mx = max(mx, ld_part(first + s * stride)); }
  var l = 0.0;
  var acc = 0.0;
  let d = ids.lid;
  for (var s = 0u; s < p.nsplit; s = s + 1u) {
    let at = first + s * stride;
    let w = exp(ld_part(at) - mx);
    l = l + ld_part(at + 1u) * w;
    if (d < p.hd) { acc = acc + ld_part(at + 2u + d) * w; }
  }
  if (d < p.hd) { st_o(g * p.hd + d, acc / l); }
}
