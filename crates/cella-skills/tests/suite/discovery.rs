//! Discovery over skill roots: precedence, shadowing, skipping, limits.

use cella_skills::discovery::{Diagnostic, Limits, Scope, SkillRoot, default_roots, discover};

use super::support::{md, skill, valid};

#[test]
fn project_shadows_user_with_a_warning() {
    let t = tempfile::tempdir().unwrap();
    let project = t.path().join("proj");
    let home = t.path().join("home");
    valid(&project.join(".agents/skills"), "shared");
    valid(&project.join(".claude/skills"), "claude-only");
    valid(&home.join(".agents/skills"), "shared");
    valid(&home.join(".agents/skills"), "user-only");
    let roots = default_roots(&project, &[], Some(&home));
    let found = discover(&roots, Limits::default());
    let names: Vec<_> = found.skills.iter().map(|d| d.skill.name.as_str()).collect();
    assert_eq!(names, ["shared", "claude-only", "user-only"]);
    assert_eq!(found.get("shared").unwrap().scope, Scope::Project);
    assert_eq!(found.get("user-only").unwrap().scope, Scope::User);
    assert!(found.diagnostics.iter().any(|d| matches!(
        d,
        Diagnostic::Shadowed { name, shadowed, .. }
            if name == "shared" && shadowed.starts_with(home.canonicalize().unwrap())
    )));
}

#[test]
fn cella_dir_wins_within_project_and_configured_roots_sit_between() {
    let t = tempfile::tempdir().unwrap();
    let project = t.path().join("p");
    let extra = t.path().join("extra");
    let home = t.path().join("h");
    skill(
        &project.join(".cella/skills"),
        "dup",
        &md("name: dup\ndescription: from cella\n"),
    );
    skill(
        &project.join(".agents/skills"),
        "dup",
        &md("name: dup\ndescription: from agents\n"),
    );
    skill(&extra, "cfg", &md("name: cfg\ndescription: configured\n"));
    skill(
        &home.join(".agents/skills"),
        "cfg",
        &md("name: cfg\ndescription: user\n"),
    );
    let found = discover(
        &default_roots(&project, &[extra], Some(&home)),
        Limits::default(),
    );
    assert_eq!(found.get("dup").unwrap().skill.description, "from cella");
    assert_eq!(found.get("cfg").unwrap().skill.description, "configured");
    assert_eq!(found.get("cfg").unwrap().scope, Scope::Configured);
}

#[test]
fn skips_git_node_modules_and_broken_skills_and_respects_depth() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("skills");
    valid(&root.join(".git"), "in-git");
    valid(&root.join("node_modules"), "in-nm");
    valid(&root.join("group/sub"), "nested");
    valid(&root.join("a/b/c/d/e/f"), "too-deep");
    skill(&root, "broken", &md("name: broken\n"));
    std::fs::write(root.join("README.md"), "not a skill").unwrap();
    let roots = [SkillRoot {
        path: root.clone(),
        scope: Scope::Configured,
    }];
    let found = discover(&roots, Limits::default());
    let names: Vec<_> = found.skills.iter().map(|d| d.skill.name.as_str()).collect();
    assert_eq!(names, ["nested"]);
    assert!(
        found
            .diagnostics
            .iter()
            .any(|d| matches!(d, Diagnostic::Skipped { path, .. } if path.ends_with("broken")))
    );
}

#[test]
fn directory_count_limit_stops_the_walk() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("many");
    for i in 0..30 {
        valid(&root, &format!("s{i:02}"));
    }
    let roots = [SkillRoot {
        path: root,
        scope: Scope::Project,
    }];
    let found = discover(
        &roots,
        Limits {
            max_depth: 5,
            max_dirs: 10,
        },
    );
    assert!(found.skills.len() < 10);
    assert!(
        found
            .diagnostics
            .iter()
            .any(|d| matches!(d, Diagnostic::LimitReached { .. }))
    );
}

#[cfg(unix)]
#[test]
fn symlink_loops_terminate() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("loop");
    valid(&root, "real");
    std::os::unix::fs::symlink(&root, root.join("again")).unwrap();
    let found = discover(
        &[SkillRoot {
            path: root,
            scope: Scope::Project,
        }],
        Limits::default(),
    );
    assert_eq!(found.skills.len(), 1);
}
