//! Templates: what a sandbox's root filesystem is made of, with its default resources,
//! environment and working directory.
//!
//! - `manifest` — the `template.toml` schema and its validation;
//! - `hash` — the content address of a build;
//! - `catalog` — shipped and user templates, and where their builds live;
//! - `build` — `cella template build`: mmdebstrap, pip and npm in a chroot, files, ownership
//!   shifted into the sandboxes' id range, atomically renamed into place.
//!
//! Mounting a built root for a sandbox is the native backend's (`native::rootfs`).

pub mod build;
pub mod catalog;
pub mod hash;
pub mod manifest;

pub use catalog::{BuildInfo, Catalog, CatalogError, Loaded, Origin, Resolved};
pub use manifest::Template;

use crate::spec::Limits;

/// Limits asked for explicitly win; then the template's defaults; then the standard ones.
pub fn effective_limits(requested: &Limits, template: &Limits) -> Limits {
    let standard = Limits::standard();
    Limits {
        memory_bytes: requested
            .memory_bytes
            .or(template.memory_bytes)
            .or(standard.memory_bytes),
        cpus: requested.cpus.or(template.cpus).or(standard.cpus),
        pids: requested.pids.or(template.pids).or(standard.pids),
        disk_bytes: requested
            .disk_bytes
            .or(template.disk_bytes)
            .or(standard.disk_bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_limits_beat_the_template_which_beats_the_standard() {
        let template = Limits {
            memory_bytes: Some(1 << 30),
            cpus: None,
            pids: Some(1000),
            disk_bytes: None,
        };
        let requested = Limits {
            pids: Some(7),
            ..Limits::default()
        };
        let l = effective_limits(&requested, &template);
        assert_eq!(l.memory_bytes, Some(1 << 30));
        assert_eq!(l.cpus, Limits::standard().cpus);
        assert_eq!(l.pids, Some(7));
        assert_eq!(l.disk_bytes, Limits::standard().disk_bytes);
    }
}
