//! loom models live in tests/.
