//! The macros that make each part of the wire format a single table: a stable-numbered enum
//! with its decoder, a `#[repr(C)]` struct whose every field offset and total size are pinned
//! at compile time, and the record kinds with their payloads. The eBPF programs and the
//! collector both compile against these, so neither side restates a number or an offset.

/// An enum with explicit, stable numbers and `from_raw`, listed once.
macro_rules! stable_ids {
    (
        $(#[$meta:meta])*
        pub enum $name:ident: $repr:ty {
            $($(#[$vmeta:meta])* $variant:ident = $value:literal,)*
        }
    ) => {
        $(#[$meta])*
        #[repr($repr)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vmeta])* $variant = $value,)*
        }

        impl $name {
            /// How many values there are.
            pub const COUNT: usize = [$($value),*].len();

            pub fn from_raw(v: $repr) -> Option<Self> {
                match v {
                    $($value => Some(Self::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

/// A `#[repr(C)]` struct of integers and byte arrays (every bit pattern a valid value), with
/// each field's offset and the total size asserted: a reordered or resized field breaks the
/// build on both sides, not the decoding of old trace files.
macro_rules! wire_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $($(#[$fmeta:meta])* $field:ident: $ty:ty = $offset:literal,)*
        }
        size $size:literal
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty,)*
        }

        const _: () = {
            assert!(core::mem::size_of::<$name>() == $size);
            // No implicit padding: every byte belongs to a field (see `Record::as_bytes`).
            assert!($size == 0 $(+ core::mem::size_of::<$ty>())*);
            $(assert!(core::mem::offset_of!($name, $field) == $offset);)*
        };

        // SAFETY: repr(C), integers and byte arrays only, layout pinned above.
        unsafe impl $crate::records::Wire for $name {}
    };
}

/// The record kinds: stable id, payload type, and whether writing one wakes the collector.
/// Generates [`Kind`](crate::Kind), its payload sizes and the [`Payload`](crate::Payload)
/// impls.
macro_rules! records {
    ($($(#[$meta:meta])* $id:literal $payload:ident wake: $wake:literal,)*) => {
        stable_ids! {
            /// Record kind ids (never reuse a number).
            pub enum Kind: u16 {
                $($(#[$meta])* $payload = $id,)*
            }
        }

        impl Kind {
            /// Bytes of this kind's payload after the header.
            pub const fn payload_size(self) -> usize {
                match self {
                    $(Self::$payload => core::mem::size_of::<$payload>(),)*
                }
            }
        }

        // A record is its header and its payload with no gap or tail (see `Record::as_bytes`).
        const _: () = {
            $(assert!(core::mem::size_of::<$payload>() % 8 == 0);)*
        };

        $(impl Payload for $payload {
            const KIND: Kind = Kind::$payload;
            const WAKE: bool = $wake;
        })*
    };
}
