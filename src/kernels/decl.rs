//! How a kernel family declares its interface to the host, once.
//!
//! * **Parameters**: the shader's `struct Params` has one host twin, declared with
//!   [`params!`](crate::params): a `#[repr(C)]` plain-old-data struct whose field list (names,
//!   byte offsets, WGSL types) is kept beside it, so `tests/shaders.rs` can compare it with
//!   the WGSL struct through naga's reflection. A field added on one side only fails that test.
//! * **Op codes**: an enum declared with [`codes!`](crate::codes) gets its values emitted into
//!   the prelude of the family's shaders as named constants (`const UN_EXP: u32 = 1u;`), so a
//!   shader says `case UN_EXP` and never a bare number.
//! * **Bindings** are declared in the shader itself, on its entry line (see `compose`).

/// One field of a parameter struct: what the reflection test compares with the WGSL struct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    /// Field name (the WGSL member's name).
    pub name: &'static str,
    /// Byte offset in the struct.
    pub offset: usize,
    /// The WGSL type, spelled as `Wgsl::WGSL` spells it.
    pub wgsl: &'static str,
}

/// A host parameter block: plain data whose bytes are the shader's `Params`.
pub trait KernelParams: bytemuck::Pod + Send + Sync + 'static {
    /// The fields, in order.
    const FIELDS: &'static [Field];
}

/// The WGSL spelling of a host field type.
pub trait Wgsl {
    /// e.g. `u32`, `f32`, `array<vec4<u32>, 2>`.
    const WGSL: &'static str;
}

impl Wgsl for u32 {
    const WGSL: &'static str = "u32";
}
impl Wgsl for i32 {
    const WGSL: &'static str = "i32";
}
impl Wgsl for f32 {
    const WGSL: &'static str = "f32";
}
impl Wgsl for [[u32; 4]; 2] {
    const WGSL: &'static str = "array<vec4<u32>, 2>";
}
impl Wgsl for [[u32; 4]; 4] {
    const WGSL: &'static str = "array<vec4<u32>, 4>";
}

/// Declares a kernel parameter struct and its field list (see the module docs).
#[macro_export]
#[doc(hidden)]
macro_rules! params {
    ($(#[$m:meta])* $vis:vis struct $name:ident { $($(#[$fm:meta])* $f:ident : $t:ty),* $(,)? }) => {
        $(#[$m])*
        /// The fields mirror the shader's `struct Params`, which documents them.
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
        #[allow(missing_docs)]
        $vis struct $name { $($(#[$fm])* pub $f: $t),* }
        impl $crate::kernels::decl::KernelParams for $name {
            const FIELDS: &'static [$crate::kernels::decl::Field] = &[
                $($crate::kernels::decl::Field {
                    name: stringify!($f),
                    offset: std::mem::offset_of!($name, $f),
                    wgsl: <$t as $crate::kernels::decl::Wgsl>::WGSL,
                }),*
            ];
        }
    };
}

/// A set of named op codes as the shader prelude declares them.
#[derive(Clone, Copy, Debug)]
pub struct Codes {
    /// (constant name, value) pairs, e.g. ("UN_EXP", 1).
    pub consts: &'static [(&'static str, u32)],
    /// WGSL functions generated with the codes (switches over them), appended to the shader.
    pub wgsl: &'static str,
}

/// Declares an op-code enum whose values are emitted into shader preludes under
/// `PREFIX_NAME` (the variant name in upper snake case, given explicitly beside it).
#[macro_export]
#[doc(hidden)]
macro_rules! codes {
    ($(#[$m:meta])* $vis:vis enum $name:ident : $prefix:literal { $($(#[$vm:meta])* $v:ident = $c:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u32)]
        $vis enum $name { $($(#[$vm])* $v),* }
        impl $name {
            /// Every value, in code order.
            pub const ALL: &'static [$name] = &[$($name::$v),*];
            /// The codes as the shader prelude declares them.
            pub const CODES: $crate::kernels::decl::Codes = $crate::kernels::decl::Codes {
                consts: &[$((concat!($prefix, "_", $c), $name::$v as u32)),*],
                wgsl: "",
            };
            /// The shader constant's name.
            #[allow(dead_code)]
            pub fn code_name(self) -> &'static str {
                Self::CODES.consts[self as usize].0
            }
        }
    };
}
