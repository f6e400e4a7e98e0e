//! Packaging and installing: round trips, determinism, and refusals (zip-slip, absolute paths,
//! escaping symlinks, existing destinations).

use std::io::Write;
use std::path::Path;

use cella_skills::package::{PackageError, install, package, unpack_bytes};
use zip::write::SimpleFileOptions;

use super::support::{md, skill, valid};

fn zip_with(path: &Path, entries: &[(&str, &[u8])]) {
    let f = std::fs::File::create(path).unwrap();
    let mut z = zip::ZipWriter::new(f);
    for (name, data) in entries {
        z.start_file(*name, SimpleFileOptions::default()).unwrap();
        z.write_all(data).unwrap();
    }
    z.finish().unwrap();
}

fn skill_md(name: &str) -> Vec<u8> {
    md(&format!("name: {name}\ndescription: x\n")).into_bytes()
}

#[test]
fn package_then_install_round_trips_and_is_deterministic() {
    let t = tempfile::tempdir().unwrap();
    let d = valid(t.path(), "round-trip");
    std::fs::create_dir_all(d.join("scripts")).unwrap();
    std::fs::write(d.join("scripts/run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            d.join("scripts/run.sh"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::os::unix::fs::symlink("scripts/run.sh", d.join("run")).unwrap();
    }
    let a = t.path().join("a.skill");
    let b = t.path().join("b.zip");
    let packed = package(&d, &a).unwrap();
    assert_eq!(packed.name, "round-trip");
    assert_eq!(packed.files, 2);
    package(&d, &b).unwrap();
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());

    let dest = t.path().join("installed");
    let inst = install(&a, &dest, false).unwrap();
    assert_eq!(inst.dir, dest.join("round-trip"));
    assert_eq!(
        std::fs::read(inst.dir.join("scripts/run.sh")).unwrap(),
        b"#!/bin/sh\necho hi\n"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(inst.dir.join("scripts/run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o111, 0o111);
        assert_eq!(
            std::fs::read_link(inst.dir.join("run")).unwrap(),
            Path::new("scripts/run.sh")
        );
    }
    // Installing again needs --force.
    assert!(matches!(
        install(&a, &dest, false),
        Err(PackageError::Exists { .. })
    ));
    assert!(install(&a, &dest, true).unwrap().replaced);
    // No staging directory is left behind.
    let left: Vec<_> = std::fs::read_dir(&dest)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["round-trip"]);
}

#[test]
fn install_from_directory_and_root_level_archive() {
    let t = tempfile::tempdir().unwrap();
    let d = valid(t.path(), "from-dir");
    let dest = t.path().join("dest");
    assert_eq!(install(&d, &dest, false).unwrap().name, "from-dir");
    let z = t.path().join("flat.zip");
    zip_with(&z, &[("SKILL.md", &skill_md("flat")), ("notes.txt", b"n")]);
    let inst = install(&z, &dest, false).unwrap();
    assert_eq!(inst.name, "flat");
    assert!(inst.dir.join("notes.txt").is_file());
}

#[test]
fn zip_slip_and_absolute_paths_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("dest");
    let md = skill_md("evil");
    let cases: [&[(&str, &[u8])]; 4] = [
        &[("evil/SKILL.md", &md), ("evil/../../escaped.txt", b"x")],
        &[("evil/SKILL.md", &md), ("/etc/evil.txt", b"x")],
        &[("evil/SKILL.md", &md), ("evil\\..\\..\\x.txt", b"x")],
        &[("evil/SKILL.md", &md), ("C:/evil.txt", b"x")],
    ];
    for (i, entries) in cases.iter().enumerate() {
        let z = t.path().join(format!("evil{i}.zip"));
        zip_with(&z, entries);
        let err = install(&z, &dest, false).unwrap_err();
        assert!(
            matches!(err, PackageError::UnsafeEntry { .. }),
            "{i}: {err}"
        );
    }
    assert!(!t.path().join("escaped.txt").exists());
    assert!(!dest.join("evil").exists());
}

#[test]
fn escaping_symlinks_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("dest");
    // In an archive.
    let z = t.path().join("link.zip");
    {
        let f = std::fs::File::create(&z).unwrap();
        let mut w = zip::ZipWriter::new(f);
        w.start_file("l/SKILL.md", SimpleFileOptions::default())
            .unwrap();
        w.write_all(&skill_md("l")).unwrap();
        w.add_symlink(
            "l/passwd",
            "../../../etc/passwd",
            SimpleFileOptions::default(),
        )
        .unwrap();
        w.finish().unwrap();
    }
    assert!(matches!(
        install(&z, &dest, false),
        Err(PackageError::SymlinkEscapes { .. })
    ));
    // In a directory, and when packaging it.
    #[cfg(unix)]
    {
        let d = valid(t.path(), "linky");
        std::os::unix::fs::symlink("/etc/hostname", d.join("host")).unwrap();
        assert!(matches!(
            install(&d, &dest, false),
            Err(PackageError::SymlinkEscapes { .. })
        ));
        assert!(matches!(
            package(&d, &t.path().join("linky.skill")),
            Err(PackageError::SymlinkEscapes { .. })
        ));
    }
}

#[test]
fn archives_without_a_skill_or_with_unsafe_names_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("dest");
    let z = t.path().join("none.zip");
    zip_with(&z, &[("a/README.md", b"x"), ("b/README.md", b"y")]);
    assert!(matches!(
        install(&z, &dest, false),
        Err(PackageError::NoSkillInArchive { .. })
    ));
    let z = t.path().join("badname.zip");
    let content = md("name: ../../x\ndescription: x\n");
    zip_with(&z, &[("s/SKILL.md", content.as_bytes())]);
    assert!(matches!(
        install(&z, &dest, false),
        Err(PackageError::BadName { .. })
    ));
    let not_zip = t.path().join("not.zip");
    std::fs::write(&not_zip, b"hello").unwrap();
    assert!(matches!(
        install(&not_zip, &dest, false),
        Err(PackageError::Zip { .. })
    ));
    let _ = skill;
}

#[cfg(unix)]
#[test]
fn symlink_chains_that_escape_are_refused() {
    // x/d -> ".." stays inside; x/d/d2 -> ".." looks inside lexically (x/d/..) but really
    // resolves to the parent of the skill.
    let t = tempfile::tempdir().unwrap();
    let z = t.path().join("chain.zip");
    {
        let f = std::fs::File::create(&z).unwrap();
        let mut w = zip::ZipWriter::new(f);
        w.start_file("c/SKILL.md", SimpleFileOptions::default())
            .unwrap();
        w.write_all(&skill_md("c")).unwrap();
        w.add_directory("c/x/", SimpleFileOptions::default())
            .unwrap();
        w.add_symlink("c/x/d", "..", SimpleFileOptions::default())
            .unwrap();
        w.add_symlink("c/x/d/d2", "..", SimpleFileOptions::default())
            .unwrap();
        w.finish().unwrap();
    }
    let dest = t.path().join("dest");
    assert!(matches!(
        install(&z, &dest, false),
        Err(PackageError::SymlinkEscapes { .. })
    ));
    assert!(!dest.join("c").exists());
}

#[test]
fn unpack_bytes_writes_the_skill_root_and_lists_its_files() {
    let t = tempfile::tempdir().unwrap();
    let z = t.path().join("s.zip");
    {
        let f = std::fs::File::create(&z).unwrap();
        let mut w = zip::ZipWriter::new(f);
        w.start_file("s/SKILL.md", SimpleFileOptions::default())
            .unwrap();
        w.write_all(&skill_md("s")).unwrap();
        w.start_file(
            "s/scripts/run.sh",
            SimpleFileOptions::default().unix_permissions(0o755),
        )
        .unwrap();
        w.write_all(b"echo hi\n").unwrap();
        w.add_symlink("s/run", "scripts/run.sh", SimpleFileOptions::default())
            .unwrap();
        w.finish().unwrap();
    }
    let bytes = std::fs::read(&z).unwrap();
    let into = t.path().join("root");
    std::fs::create_dir(&into).unwrap();
    let got = unpack_bytes(&bytes, Path::new("upload"), &into, 1 << 20).unwrap();
    assert_eq!(got.folder.as_deref(), Some("s"));
    let files: Vec<(&str, u64, bool, Option<&str>)> = got
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.size, f.executable, f.symlink.as_deref()))
        .collect();
    assert_eq!(
        files,
        vec![
            ("SKILL.md", skill_md("s").len() as u64, false, None),
            ("run", 14, false, Some("scripts/run.sh")),
            ("scripts/run.sh", 8, true, None),
        ]
    );
    assert_eq!(
        std::fs::read_to_string(into.join("run")).unwrap(),
        "echo hi\n"
    );

    // Root-level archive: no folder.
    let z = t.path().join("flat.zip");
    zip_with(&z, &[("SKILL.md", &skill_md("flat"))]);
    let into = t.path().join("flat");
    std::fs::create_dir(&into).unwrap();
    let got = unpack_bytes(
        &std::fs::read(&z).unwrap(),
        Path::new("upload"),
        &into,
        1 << 20,
    )
    .unwrap();
    assert_eq!(got.folder, None);
    assert!(into.join("SKILL.md").is_file());

    // The caller's size limit, zip-slip, and bytes that are no zip.
    let z = t.path().join("big.zip");
    zip_with(
        &z,
        &[("b/SKILL.md", &skill_md("b")), ("b/big", &[0u8; 4096])],
    );
    let into = t.path().join("big");
    std::fs::create_dir(&into).unwrap();
    let err = unpack_bytes(
        &std::fs::read(&z).unwrap(),
        Path::new("upload"),
        &into,
        1000,
    )
    .unwrap_err();
    assert!(
        matches!(&err, PackageError::TooLarge { limit, .. } if limit == "1000 unpacked bytes"),
        "{err}"
    );
    let z = t.path().join("slip.zip");
    zip_with(&z, &[("e/SKILL.md", &skill_md("e")), ("e/../../x", b"x")]);
    let into = t.path().join("slip");
    std::fs::create_dir(&into).unwrap();
    let err = unpack_bytes(
        &std::fs::read(&z).unwrap(),
        Path::new("upload"),
        &into,
        1 << 20,
    )
    .unwrap_err();
    assert!(matches!(err, PackageError::UnsafeEntry { .. }), "{err}");
    assert!(!t.path().join("x").exists());
    let err = unpack_bytes(b"not a zip", Path::new("upload"), &into, 1 << 20).unwrap_err();
    assert!(matches!(err, PackageError::Zip { .. }), "{err}");
}
