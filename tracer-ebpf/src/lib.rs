#![no_std]
// The library target exists so that tracer-user can name this crate as a build dependency.
