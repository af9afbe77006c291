//! Generation engine.
