//! The GGUF reader against the `gguf` Python package's files and decoders
//! (tests/fixtures/quant_blocks.gguf, written by scripts/make_gguf_fixture.py), against
//! hand-made malformed files, and against random damage to the fixture.

use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use wgrad::Error;
use wgrad::gguf::{Array, GgmlType, GgufFile, Value, ValueType};

/// Records the largest single allocation each thread makes, so the damage tests can check that
/// no count read from a file is trusted with an allocation larger than the file justifies.
struct Tracking;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|c| c.set(c.get().max(size)));
}

// SAFETY: every call is forwarded unchanged to the system allocator; `note` only touches a
// const-initialised thread-local without a destructor, which never allocates.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Tracking = Tracking;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant_blocks.gguf")
}

fn fixture_bytes() -> Vec<u8> {
    std::fs::read(fixture()).unwrap()
}

/// A temporary file holding `bytes`, removed on drop; names are unique across threads and
/// processes.
struct Temp(PathBuf);

impl Temp {
    fn new(bytes: &[u8]) -> Temp {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("wgrad-gguf-{}-{n}.gguf", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        Temp(path)
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The `Error::Format` detail of opening `bytes` (and that its path names the file).
fn open_error(bytes: &[u8]) -> String {
    let t = Temp::new(bytes);
    match GgufFile::open(&t.0) {
        Err(Error::Format { path, detail }) => {
            assert_eq!(path, t.0.display().to_string());
            detail
        }
        other => panic!("expected a format error, got {other:?}"),
    }
}

/// Every decoded type of the fixture, by tensor name prefix.
const TYPES: [(&str, GgmlType); 19] = [
    ("f32", GgmlType::F32),
    ("f16", GgmlType::F16),
    ("bf16", GgmlType::BF16),
    ("f64", GgmlType::F64),
    ("i8", GgmlType::I8),
    ("i16", GgmlType::I16),
    ("i32", GgmlType::I32),
    ("i64", GgmlType::I64),
    ("q4_0", GgmlType::Q4_0),
    ("q4_1", GgmlType::Q4_1),
    ("q5_0", GgmlType::Q5_0),
    ("q5_1", GgmlType::Q5_1),
    ("q8_0", GgmlType::Q8_0),
    ("q2_k", GgmlType::Q2_K),
    ("q3_k", GgmlType::Q3_K),
    ("q4_k", GgmlType::Q4_K),
    ("q5_k", GgmlType::Q5_K),
    ("q6_k", GgmlType::Q6_K),
    ("q8_k", GgmlType::Q8_K),
];

/// Every format decodes to exactly the package's values: 0 ulp, compared as bits, because the
/// decoders do the same f32 operations in the same order as ggml's.
#[test]
fn every_type_matches_the_package_bit_for_bit() {
    let file = GgufFile::open(fixture()).unwrap();
    for (name, ty) in TYPES {
        let raw = file.tensor(&format!("{name}.raw")).unwrap();
        let reference = file.tensor(&format!("{name}.ref")).unwrap();
        assert_eq!(raw.ggml_type(), ty, "{name}");
        assert_eq!(reference.ggml_type(), GgmlType::F32, "{name}");
        assert_eq!(raw.dims(), reference.dims(), "{name}");
        assert_eq!(
            raw.n_bytes(),
            ty.bytes_for(raw.n_elements()).unwrap(),
            "{name}"
        );
        let got = file.dequantize(raw.name()).unwrap();
        let want = file.dequantize(reference.name()).unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        let bad: Vec<_> = (0..got.len())
            .filter(|&i| got[i].to_bits() != want[i].to_bits())
            .take(5)
            .map(|i| (i, got[i], want[i]))
            .collect();
        assert!(
            bad.is_empty(),
            "{name}: (index, wgrad, gguf package) {bad:?}"
        );
        // Nothing degenerate: the fixture's scales make every block decode to varied values.
        assert!(got.iter().any(|&x| x != 0.0), "{name}");
    }
}

#[test]
fn tensor_table_and_dims_order() {
    let file = GgufFile::open(fixture()).unwrap();
    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), 32);
    assert_eq!(file.data_offset() % 32, 0);
    assert_eq!(file.tensors().len(), 2 * TYPES.len());
    let f16 = file.tensor("f16.raw").unwrap();
    // numpy shape (4, 2, 32): stored innermost first.
    assert_eq!(f16.dims(), &[32, 2, 4]);
    assert_eq!(f16.shape(), vec![4, 2, 32]);
    assert_eq!(f16.n_elements(), 256);
    let q = file.tensor("q4_k.raw").unwrap();
    assert_eq!(q.shape(), vec![4, 256]);
    let bytes = file.tensor_bytes(q).unwrap();
    assert_eq!(bytes.len(), 4 * 144);
    assert_eq!(q.file_offset(), file.data_offset() + q.offset());
    let whole = fixture_bytes();
    let start = q.file_offset() as usize;
    assert_eq!(bytes, &whole[start..start + 4 * 144]);
    for t in file.tensors() {
        assert_eq!(t.offset() % 32, 0, "{}", t.name());
    }
    assert!(file.tensor("absent").is_none());
    let e = file.dequantize("absent").unwrap_err().to_string();
    assert!(e.contains("no tensor named \"absent\""), "{e}");
}

#[test]
fn metadata_reads_back_exactly() {
    let file = GgufFile::open(fixture()).unwrap();
    let get = |k: &str| file.get(k).unwrap().clone();
    assert_eq!(
        get("general.architecture"),
        Value::String("wgrad-test".into())
    );
    assert_eq!(get("test.u8"), Value::U8(200));
    assert_eq!(get("test.i8"), Value::I8(-100));
    assert_eq!(get("test.u16"), Value::U16(60000));
    assert_eq!(get("test.i16"), Value::I16(-30000));
    assert_eq!(get("test.u32"), Value::U32(4_000_000_000));
    assert_eq!(get("test.i32"), Value::I32(-2_000_000_000));
    assert_eq!(get("test.f32"), Value::F32(0.1));
    assert_eq!(get("test.bool"), Value::Bool(true));
    assert_eq!(
        get("test.string"),
        Value::String("h\u{e9}llo \u{2713}".into())
    );
    assert_eq!(get("test.u64"), Value::U64((1 << 63) + 5));
    assert_eq!(get("test.i64"), Value::I64(-(1 << 62)));
    assert_eq!(get("test.f64"), Value::F64(0.1));
    assert_eq!(
        get("test.array.i32"),
        Value::Array(Array::I32(vec![1, -2, 3]))
    );
    assert_eq!(
        get("test.array.f32"),
        Value::Array(Array::F32(vec![0.5, -1.25, 3.0e38]))
    );
    assert_eq!(
        get("test.array.bool"),
        Value::Array(Array::Bool(vec![true, false, true]))
    );
    assert_eq!(
        get("test.array.u8"),
        Value::Array(Array::U8(vec![0, 7, 255]))
    );
    let strs = ["a", "bc", "", "\u{fc}\u{f1}\u{ee}"]
        .map(String::from)
        .to_vec();
    assert_eq!(
        get("test.array.str"),
        Value::Array(Array::String(strs.clone()))
    );
    assert_eq!(
        get("test.array.nested"),
        Value::Array(Array::Array(vec![
            Array::I32(vec![1, 2]),
            Array::I32(vec![3])
        ]))
    );
    assert_eq!(file.metadata().len(), 19);
    assert_eq!(file.metadata().next().unwrap().0, "general.architecture");

    // Typed access: integers widen or narrow when the value fits, nothing else converts.
    assert_eq!(file.get_u32("test.u8").unwrap(), 200);
    assert_eq!(file.get_u32("test.u32").unwrap(), 4_000_000_000);
    assert_eq!(file.get_u64("test.u64").unwrap(), (1 << 63) + 5);
    assert_eq!(file.get_i64("test.i8").unwrap(), -100);
    assert_eq!(file.get_f32("test.f32").unwrap(), 0.1);
    assert_eq!(file.get_f64("test.f64").unwrap(), 0.1);
    assert_eq!(file.get_f64("test.f32").unwrap(), 0.1f32 as f64);
    assert!(file.get_bool("test.bool").unwrap());
    assert_eq!(file.get_str("test.string").unwrap(), "h\u{e9}llo \u{2713}");
    assert_eq!(
        file.get_str_array("test.array.str").unwrap(),
        strs.as_slice()
    );
    assert_eq!(
        file.get_f32_array("test.array.f32").unwrap(),
        &[0.5, -1.25, 3.0e38]
    );
    assert_eq!(file.get_i32_array("test.array.i32").unwrap(), &[1, -2, 3]);
    assert_eq!(
        file.get_array("test.array.nested").unwrap().elem_type(),
        ValueType::Array
    );
    for (key, e) in [
        ("test.i8", file.get_u32("test.i8").unwrap_err()),
        ("test.u64", file.get_i64("test.u64").unwrap_err()),
        ("test.u8", file.get_str("test.u8").unwrap_err()),
        ("test.f64", file.get_f32("test.f64").unwrap_err()),
        (
            "test.array.i32",
            file.get_f32_array("test.array.i32").unwrap_err(),
        ),
        ("test.missing", file.get_u32("test.missing").unwrap_err()),
    ] {
        let Error::Format { path, detail } = e else {
            panic!("{key}: not a format error")
        };
        assert!(path.ends_with("quant_blocks.gguf"));
        assert!(
            detail.contains(&format!("metadata key {key:?}")),
            "{detail}"
        );
    }
    assert_eq!(
        file.get("test.array.i32").unwrap().to_string(),
        "[1, -2, 3]"
    );
    assert_eq!(
        file.get("test.string").unwrap().to_string(),
        "\"h\u{e9}llo \u{2713}\""
    );
}

/// Version 2 differs from 3 only in allowing big-endian files, so the fixture with its version
/// field set to 2 reads the same.
#[test]
fn version_2_reads_like_3() {
    let mut bytes = fixture_bytes();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let t = Temp::new(&bytes);
    let v2 = GgufFile::open(&t.0).unwrap();
    let v3 = GgufFile::open(fixture()).unwrap();
    assert_eq!(v2.version(), 2);
    assert!(v2.tensors().eq(v3.tensors()));
    assert!(v2.metadata().eq(v3.metadata()));
    assert_eq!(
        v2.dequantize("q6_k.raw").unwrap(),
        v3.dequantize("q6_k.raw").unwrap()
    );
}

/// Builds small GGUF files field by field.
#[derive(Default)]
struct Builder {
    version: u32,
    n_kv: u64,
    kv: Vec<u8>,
    n_tensors: u64,
    table: Vec<u8>,
    alignment: usize,
    data: Vec<u8>,
}

fn string(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u64).to_le_bytes().to_vec();
    b.extend(s.as_bytes());
    b
}

impl Builder {
    fn new() -> Builder {
        Builder {
            version: 3,
            alignment: 32,
            ..Builder::default()
        }
    }

    fn kv(mut self, key: &str, ty: u32, value: &[u8]) -> Builder {
        self.n_kv += 1;
        self.kv.extend(string(key));
        self.kv.extend(ty.to_le_bytes());
        self.kv.extend(value);
        self
    }

    fn tensor(mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Builder {
        self.n_tensors += 1;
        self.table.extend(string(name));
        self.table.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            self.table.extend(d.to_le_bytes());
        }
        self.table.extend(ty.to_le_bytes());
        self.table.extend(offset.to_le_bytes());
        self
    }

    fn data(mut self, data: &[u8]) -> Builder {
        self.data = data.to_vec();
        self
    }

    fn build(&self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(self.version.to_le_bytes());
        b.extend(self.n_tensors.to_le_bytes());
        b.extend(self.n_kv.to_le_bytes());
        b.extend(&self.kv);
        b.extend(&self.table);
        b.resize(b.len().next_multiple_of(self.alignment), 0);
        b.extend(&self.data);
        b
    }
}

#[test]
fn a_hand_built_file_reads() {
    // Alignment 64, a Q8_0 tensor of one block at offset 0 and an F32 one at offset 64.
    let mut block = vec![0u8; 34];
    block[..2].copy_from_slice(&wgrad::half::f16::from_f32(0.25).to_le_bytes());
    for (i, q) in block[2..].iter_mut().enumerate() {
        *q = (i as i8 - 16) as u8;
    }
    let mut data = block.clone();
    data.resize(64, 0);
    data.extend([1.5f32, -2.0].iter().flat_map(|x| x.to_le_bytes()));
    let mut b = Builder::new()
        .kv("general.alignment", 4, &64u32.to_le_bytes())
        .tensor("q", &[32], 8, 0)
        .tensor("f", &[2, 1], 0, 64)
        .data(&data);
    b.alignment = 64;
    let t = Temp::new(&b.build());
    let file = GgufFile::open(&t.0).unwrap();
    assert_eq!((file.alignment(), file.data_offset() % 64), (64, 0));
    let q = file.dequantize("q").unwrap();
    assert_eq!(
        q,
        (0..32).map(|i| (i - 16) as f32 * 0.25).collect::<Vec<_>>()
    );
    assert_eq!(file.dequantize("f").unwrap(), vec![1.5, -2.0]);
    assert_eq!(file.tensor("f").unwrap().shape(), vec![1, 2]);
}

#[test]
fn malformed_headers_name_the_field() {
    let good = fixture_bytes();

    let mut bytes = good.clone();
    bytes[..4].copy_from_slice(b"GGML");
    let e = open_error(&bytes);
    assert!(
        e.starts_with("magic:") && e.contains("not a GGUF file"),
        "{e}"
    );

    let mut bytes = good.clone();
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    let e = open_error(&bytes);
    assert!(e.starts_with("version:") && e.contains("version 1"), "{e}");

    let e = open_error(&good[..12]);
    assert!(e.starts_with("tensor count: truncated"), "{e}");
    let e = open_error(&good[..3]);
    assert!(e.starts_with("magic: truncated"), "{e}");
    let e = open_error(&[]);
    assert!(e.starts_with("magic: truncated"), "{e}");

    let mut bytes = good.clone();
    bytes[8..16].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let e = open_error(&bytes);
    assert!(
        e.starts_with("tensor count: 1152921504606846976 cannot fit"),
        "{e}"
    );

    let mut bytes = good.clone();
    bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = open_error(&bytes);
    assert!(e.starts_with("metadata count:"), "{e}");

    // The first key's length, right after the header.
    let mut bytes = good.clone();
    bytes[24..32].copy_from_slice(&(1u64 << 62).to_le_bytes());
    let e = open_error(&bytes);
    assert!(
        e.starts_with("metadata key #0: string length 4611686018427387904 exceeds"),
        "{e}"
    );

    // Cut inside the tensor table and inside the data.
    let file = GgufFile::open(fixture()).unwrap();
    let e = open_error(&good[..file.data_offset() as usize - 40]);
    assert!(e.starts_with("tensor ") && e.contains("truncated"), "{e}");
    let e = open_error(&good[..good.len() - 1]);
    assert!(
        e.starts_with("tensor \"f64.ref\": data [") && e.contains("outside the file"),
        "{e}"
    );
}

#[test]
fn malformed_entries_name_the_field() {
    let one = [0u8; 4];
    let e = open_error(&Builder::new().kv("k", 13, &one).build());
    assert_eq!(e, "metadata key \"k\": value type: unknown value type 13");

    let e = open_error(
        &Builder::new()
            .kv("k", 9, &[99, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0])
            .build(),
    );
    assert!(
        e.starts_with("metadata key \"k\": array element type: unknown value type 99"),
        "{e}"
    );

    let mut huge = 8u32.to_le_bytes().to_vec();
    huge.extend((1u64 << 61).to_le_bytes());
    let e = open_error(&Builder::new().kv("k", 9, &huge).build());
    assert!(
        e.starts_with("metadata key \"k\": array count: 2305843009213693952 cannot fit"),
        "{e}"
    );

    let mut latin1 = 1u64.to_le_bytes().to_vec();
    latin1.push(0xff);
    let e = open_error(&Builder::new().kv("k", 8, &latin1).build());
    assert!(
        e.starts_with("metadata key \"k\": string is not UTF-8"),
        "{e}"
    );

    let e = open_error(&Builder::new().kv("k", 0, &[1]).kv("k", 0, &[2]).build());
    assert_eq!(e, "metadata key \"k\": appears twice");

    let e = open_error(
        &Builder::new()
            .kv("general.alignment", 4, &24u32.to_le_bytes())
            .build(),
    );
    assert!(
        e.starts_with("metadata key \"general.alignment\": u32 24 is not"),
        "{e}"
    );

    let data = [0u8; 64];
    let e = open_error(&Builder::new().tensor("w", &[4], 77, 0).data(&data).build());
    assert_eq!(e, "tensor \"w\": type: unknown type id 77");

    let e = open_error(&Builder::new().tensor("w", &[4], 0, 64).data(&data).build());
    assert!(
        e.starts_with("tensor \"w\": data [") && e.ends_with("outside the file (128 bytes)"),
        "{e}"
    );

    let e = open_error(&Builder::new().tensor("w", &[4], 0, 16).data(&data).build());
    assert_eq!(
        e,
        "tensor \"w\": offset: 16 is not a multiple of the alignment 32"
    );

    let e = open_error(
        &Builder::new()
            .tensor("w", &[1 << 32, 1 << 32], 0, 0)
            .build(),
    );
    assert!(
        e.starts_with("tensor \"w\": dims:") && e.contains("overflow"),
        "{e}"
    );

    let e = open_error(
        &Builder::new()
            .tensor("w", &[1 << 40, 1 << 22], 0, 0)
            .build(),
    );
    assert!(
        e.starts_with("tensor \"w\": dims:") && e.contains("overflow the byte count"),
        "{e}"
    );

    let e = open_error(&Builder::new().tensor("w", &[48], 12, 0).data(&data).build());
    assert!(
        e.starts_with("tensor \"w\": dims[0]: 48 is not a multiple of Q4_K's block"),
        "{e}"
    );

    let e = open_error(
        &Builder::new()
            .tensor("w", &[1; 5], 0, 0)
            .data(&data)
            .build(),
    );
    assert_eq!(e, "tensor \"w\": n_dims: 5 dimensions, at most 4");

    let e = open_error(
        &Builder::new()
            .tensor("w", &[1], 0, 0)
            .tensor("w", &[1], 0, 32)
            .data(&data)
            .build(),
    );
    assert_eq!(e, "tensor \"w\": name: appears twice");

    // A type the reader knows but does not decode opens; only dequantizing it is an error.
    let t = Temp::new(
        &Builder::new()
            .tensor("iq", &[256], 16, 0)
            .data(&[0; 66])
            .build(),
    );
    let file = GgufFile::open(&t.0).unwrap();
    assert_eq!(
        file.tensor_bytes(file.tensor("iq").unwrap()).unwrap().len(),
        66
    );
    let e = file.dequantize("iq").unwrap_err().to_string();
    assert!(e.contains("tensor \"iq\" (IQ2_XXS): no decoder"), "{e}");
}

/// Opens `bytes` and decodes every tensor: any result but a panic is fine. Returns the largest
/// single allocation made, against the file's size.
fn open_all(bytes: &[u8]) -> usize {
    let t = Temp::new(bytes);
    LARGEST.with(|c| c.set(0));
    if let Ok(file) = GgufFile::open(&t.0) {
        let names: Vec<String> = file.tensors().map(|t| t.name().to_string()).collect();
        for name in names {
            let _ = file.dequantize(&name);
        }
        for (_, v) in file.metadata() {
            let _ = v.to_string();
        }
    }
    LARGEST.with(|c| c.get())
}

/// The most any single allocation may take for a file of `len` bytes: the decoded values of a
/// tensor (Q2_K, the densest format decoded, holds 256 values in 84 bytes: 12.2 f32 bytes per
/// file byte) or the parsed metadata and table, a few times their size in the file.
fn allocation_limit(len: usize) -> usize {
    16 * len + 4096
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn truncated_fixtures_never_panic(cut in 0usize..70_000) {
        let good = fixture_bytes();
        let bytes = &good[..cut.min(good.len())];
        let largest = open_all(bytes);
        prop_assert!(largest <= allocation_limit(bytes.len()), "{largest} bytes for a {cut}-byte file");
    }

    #[test]
    fn edited_fixtures_never_panic(
        edits in proptest::collection::vec((any::<bool>(), any::<usize>(), any::<u64>(), 0usize..3), 1..8),
    ) {
        let mut bytes = fixture_bytes();
        let header = GgufFile::open(fixture()).unwrap().data_offset() as usize;
        for (in_header, at, value, width) in edits {
            // Mostly in the header, where counts, lengths, types and offsets live.
            let span = if in_header { header } else { bytes.len() };
            let at = at % span;
            let width = [1, 4, 8][width];
            let end = (at + width).min(bytes.len());
            bytes[at..end].copy_from_slice(&value.to_le_bytes()[..end - at]);
        }
        let largest = open_all(&bytes);
        prop_assert!(largest <= allocation_limit(bytes.len()), "{largest} bytes for a {}-byte file", bytes.len());
    }
}
