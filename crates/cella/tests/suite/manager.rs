//! SandboxManager and the envd protocol through a real native sandbox: lifecycle (list, pause,
//! resume, end time, kill) and process semantics (event order, stdin, PTY, signals, background
//! processes, Connect errors).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cella_proto::Code;
use cella_proto::process::*;
use cella_sandbox::native::{NativeBackend, NativeConfig};
use cella_sandbox::{ClientError, EnvdClient, SandboxManager, SandboxSpec};

use crate::require_root;

fn manager() -> Arc<SandboxManager> {
    let backend = NativeBackend::new(NativeConfig::with_helper(
        env!("CARGO_BIN_EXE_cella").into(),
    ))
    .expect("backend");
    SandboxManager::new(Arc::new(backend))
}

fn start(cmd: &str, args: &[&str]) -> StartRequest {
    StartRequest {
        process: Some(ProcessConfig {
            cmd: cmd.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Collects a process's events until the end.
async fn run_to_end(client: &EnvdClient, req: &StartRequest) -> Vec<ProcessEvent> {
    let mut s = client.start(req, None).await.expect("start");
    let mut events = vec![];
    while let Some(ev) = s.next().await {
        let ev = ev.expect("event");
        let end = matches!(ev, ProcessEvent::End(_));
        events.push(ev);
        if end {
            break;
        }
    }
    events
}

fn output(events: &[ProcessEvent]) -> (String, String, Option<EndEvent>) {
    let (mut out, mut err, mut end) = (String::new(), String::new(), None);
    for ev in events {
        match ev {
            ProcessEvent::Data(ProcessOutput::Stdout(b))
            | ProcessEvent::Data(ProcessOutput::Pty(b)) => {
                out.push_str(&String::from_utf8_lossy(b))
            }
            ProcessEvent::Data(ProcessOutput::Stderr(b)) => {
                err.push_str(&String::from_utf8_lossy(b))
            }
            ProcessEvent::End(e) => end = Some(e.clone()),
            _ => {}
        }
    }
    (out, err, end)
}

#[tokio::test]
async fn events_come_in_order_start_data_end() {
    let mgr = manager();
    let sb = mgr.create(SandboxSpec::default()).await.expect("create");
    let events = run_to_end(
        &sb.envd,
        &start("/bin/bash", &["-c", "echo a; echo b >&2; exit 3"]),
    )
    .await;
    assert!(
        matches!(events.first(), Some(ProcessEvent::Start { pid }) if *pid > 1),
        "{events:?}"
    );
    let (out, err, end) = output(&events);
    assert_eq!((out.as_str(), err.as_str()), ("a\n", "b\n"));
    let end = end.expect("end");
    assert_eq!(
        (end.exit_code, end.exited, end.status.as_str()),
        (3, true, "exit status 3")
    );
    assert!(matches!(events.last(), Some(ProcessEvent::End(_))));
    mgr.kill(&sb.id).await.expect("kill");
}

#[tokio::test]
async fn stdin_signals_and_background_processes() {
    let mgr = manager();
    let sb = mgr.create(SandboxSpec::default()).await.expect("create");
    let c = &sb.envd;
    // A background process with stdin, addressed by tag, fed through SendInput.
    let mut req = start("/bin/cat", &[]);
    req.stdin = Some(true);
    req.tag = Some("cat".into());
    let mut stream = c.start(&req, None).await.expect("start");
    let pid = match stream.next().await {
        Some(Ok(ProcessEvent::Start { pid })) => pid,
        other => panic!("{other:?}"),
    };
    let list: ListResponse = c
        .unary("/process.Process/List", &ListRequest {}, None)
        .await
        .expect("list");
    assert!(
        list.processes
            .iter()
            .any(|p| p.pid == pid && p.tag.as_deref() == Some("cat")),
        "{list:?}"
    );
    let input = SendInputRequest {
        process: Some(ProcessSelector::Tag("cat".into())),
        input: Some(ProcessInput::Stdin("ping\n".into())),
    };
    let _: Empty = c
        .unary("/process.Process/SendInput", &input, None)
        .await
        .expect("send input");
    match stream.next().await {
        Some(Ok(ProcessEvent::Data(ProcessOutput::Stdout(b)))) => assert_eq!(&b[..], b"ping\n"),
        other => panic!("{other:?}"),
    }
    // A second client attaches with Connect and sees the end too.
    let mut attached = c
        .stream(
            "/process.Process/Connect",
            &ConnectRequest {
                process: Some(ProcessSelector::Pid(pid)),
            },
            None,
            None,
        )
        .await
        .expect("connect");
    let first: ProcessEventMessage = attached.next().await.expect("event").expect("ok");
    assert_eq!(first.event, ProcessEvent::Start { pid });
    let _: Empty = c
        .unary(
            "/process.Process/SendSignal",
            &SendSignalRequest {
                process: Some(ProcessSelector::Pid(pid)),
                signal: Signal::Sigterm,
            },
            None,
        )
        .await
        .expect("signal");
    let mut end = None;
    while let Some(Ok(ev)) = stream.next().await {
        if let ProcessEvent::End(e) = ev {
            end = Some(e);
            break;
        }
    }
    let end = end.expect("end");
    assert_eq!(
        (end.exit_code, end.exited, end.status.as_str()),
        (-1, false, "signal: terminated")
    );
    // Errors carry Connect codes.
    let err = c
        .unary::<_, Empty>("/process.Process/SendInput", &input, None)
        .await
        .expect_err("gone");
    assert_eq!(err.code(), Code::NotFound, "{err}");
    let err = c
        .start(&start("/no/such/binary", &[]), None)
        .await
        .err()
        .expect("not found");
    assert_eq!(err.code(), Code::NotFound);
    let err = c
        .start(&StartRequest::default(), None)
        .await
        .err()
        .expect("invalid");
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = c
        .start(&start("/bin/true", &[]), Some("mallory"))
        .await
        .err()
        .expect("bad user");
    assert!(
        matches!(err, ClientError::Rpc(ref e) if e.code == Code::Unauthenticated),
        "{err}"
    );
    mgr.kill(&sb.id).await.expect("kill");
}

#[tokio::test]
async fn pty_sessions_resize_and_echo() {
    let mgr = manager();
    let sb = mgr.create(SandboxSpec::default()).await.expect("create");
    let c = &sb.envd;
    let mut req = start("/bin/bash", &["-c", "stty size; read line; echo got:$line"]);
    req.pty = Some(Pty {
        size: Some(PtySize {
            cols: 100,
            rows: 30,
        }),
    });
    let mut stream = c.start(&req, None).await.expect("start");
    let Some(Ok(ProcessEvent::Start { pid })) = stream.next().await else {
        panic!("no start")
    };
    let mut seen = String::new();
    while !seen.contains("30 100") {
        match stream.next().await {
            Some(Ok(ProcessEvent::Data(ProcessOutput::Pty(b)))) => {
                seen.push_str(&String::from_utf8_lossy(&b))
            }
            other => panic!("{other:?} after {seen:?}"),
        }
    }
    let _: Empty = c
        .unary(
            "/process.Process/Update",
            &UpdateRequest {
                process: Some(ProcessSelector::Pid(pid)),
                pty: Some(Pty {
                    size: Some(PtySize { cols: 50, rows: 10 }),
                }),
            },
            None,
        )
        .await
        .expect("resize");
    let input = SendInputRequest {
        process: Some(ProcessSelector::Pid(pid)),
        input: Some(ProcessInput::Pty("hello\r".into())),
    };
    let _: Empty = c
        .unary("/process.Process/SendInput", &input, None)
        .await
        .expect("input");
    let mut end = None;
    while let Some(Ok(ev)) = stream.next().await {
        match ev {
            ProcessEvent::Data(ProcessOutput::Pty(b)) => {
                seen.push_str(&String::from_utf8_lossy(&b))
            }
            ProcessEvent::End(e) => {
                end = Some(e);
                break;
            }
            _ => {}
        }
    }
    assert!(seen.contains("got:hello"), "{seen:?}");
    assert_eq!(end.expect("end").exit_code, 0);
    // Resizing a pipe process is refused clearly.
    let mut s2 = c
        .start(&start("/bin/sleep", &["5"]), None)
        .await
        .expect("start");
    let Some(Ok(ProcessEvent::Start { pid })) = s2.next().await else {
        panic!()
    };
    let err = c
        .unary::<_, Empty>(
            "/process.Process/Update",
            &UpdateRequest {
                process: Some(ProcessSelector::Pid(pid)),
                pty: Some(Pty {
                    size: Some(PtySize { cols: 1, rows: 1 }),
                }),
            },
            None,
        )
        .await
        .expect_err("no pty");
    assert_eq!(err.code(), Code::FailedPrecondition);
    mgr.kill(&sb.id).await.expect("kill");
}

#[tokio::test]
async fn lifecycle_list_pause_resume_end_time_kill() {
    require_root!();
    let mgr = manager();
    let sb = mgr.create(SandboxSpec::default()).await.expect("create");
    assert!(mgr.list().iter().any(|s| s.id == sb.id));
    // A counter that advances while running and stops while paused.
    let mut req = start(
        "/bin/bash",
        &[
            "-c",
            "i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.05; done",
        ],
    );
    req.tag = Some("counter".into());
    let _stream = sb.envd.start(&req, None).await.expect("start");
    tokio::time::sleep(Duration::from_millis(300)).await;
    mgr.pause(&sb.id).expect("pause");
    assert!(matches!(
        mgr.pause(&sb.id),
        Err(cella_sandbox::SandboxError::Paused(_))
    ));
    let read = || {
        std::fs::read_to_string(format!(
            "/proc/{}/root/tmp/n",
            sb.instance.state["init_pid"].as_i64().unwrap_or(0)
        ))
    };
    let a = read().expect("read counter");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = read().expect("read counter");
    assert_eq!(a, b, "processes kept running while paused");
    mgr.resume(&sb.id).expect("resume");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let c = read().expect("read counter");
    assert_ne!(
        b, c,
        "processes did not continue after resume (files and processes must survive pause)"
    );
    // End time: the manager kills it at the deadline.
    mgr.set_end(&sb.id, Some(SystemTime::now() + Duration::from_millis(300)))
        .expect("set end");
    let mut ended = sb.instance.ended.clone();
    tokio::time::timeout(Duration::from_secs(3), ended.wait_for(|e| *e))
        .await
        .expect("killed at end time")
        .expect("watch");
    assert!(mgr.get(&sb.id).is_err());
    // Its host files and cgroups are gone.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let dir = sb.instance.state["dir"].as_str().expect("dir");
    assert!(!std::path::Path::new(dir).exists(), "{dir} left behind");
}

#[tokio::test]
async fn keepalives_arrive_and_orphans_are_reaped() {
    let mgr = manager();
    let sb = mgr.create(SandboxSpec::default()).await.expect("create");
    let req = start("/bin/bash", &["-c", "sleep 1.5"]);
    let mut s = sb
        .envd
        .stream("/process.Process/Start", &req, None, Some(1))
        .await
        .expect("start");
    let mut keepalives = 0;
    while let Some(msg) = s.next::<ProcessEventMessage>().await {
        match msg.expect("event").event {
            ProcessEvent::Keepalive {} => keepalives += 1,
            ProcessEvent::End(_) => break,
            _ => {}
        }
    }
    assert!(
        keepalives >= 1,
        "no keepalive within 1.5 s at a 1 s interval"
    );
    // Orphans re-parented to envd (PID 1) are reaped: no zombies accumulate.
    let events = run_to_end(&sb.envd, &start("/bin/bash", &["-c", "for i in 1 2 3 4 5; do (sleep 0.05 &); done; sleep 0.5; ps -eo stat= | grep -c Z || true"])).await;
    let (out, _, _) = output(&events);
    assert_eq!(out.trim(), "0", "zombies left: {out}");
    mgr.kill(&sb.id).await.expect("kill");
}

#[tokio::test]
async fn skills_are_mounted_read_only_and_bad_names_refused() {
    let skill = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        skill.path().join("SKILL.md"),
        "---\nname: hello\ndescription: says hello\n---\nRun scripts/hi.sh\n",
    )
    .expect("write");
    std::fs::create_dir(skill.path().join("scripts")).expect("mkdir");
    std::fs::write(skill.path().join("scripts/hi.sh"), "echo hi from skill\n").expect("write");
    let mgr = manager();
    let mut spec = SandboxSpec::default();
    spec.skills
        .insert("hello".into(), skill.path().to_path_buf());
    let sb = mgr.create(spec).await.expect("create");
    let events = run_to_end(&sb.envd, &start("/bin/bash", &["-c", "head -2 /skills/hello/SKILL.md; bash /skills/hello/scripts/hi.sh; touch /skills/hello/x 2>&1; rm /skills/hello/SKILL.md 2>&1; true"])).await;
    let (out, _, _) = output(&events);
    assert!(
        out.contains("name: hello") && out.contains("hi from skill"),
        "{out}"
    );
    assert_eq!(out.matches("Read-only file system").count(), 2, "{out}");
    assert!(skill.path().join("SKILL.md").exists());
    mgr.kill(&sb.id).await.expect("kill");
    for bad in ["../etc", "a/b", "..", ""] {
        let mut spec = SandboxSpec::default();
        spec.skills.insert(bad.into(), skill.path().to_path_buf());
        let err = mgr.create(spec).await.err().expect("refused");
        assert!(
            err.to_string().contains("invalid skill name"),
            "{bad}: {err}"
        );
    }
}

async fn wait_ready(mgr: &SandboxManager, want: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let ready = mgr.pool_stats().first().map_or(0, |p| p.ready);
        if ready >= want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pool never reached {want} ready sandboxes: {:?}",
            mgr.pool_stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn warm_pool_serves_matching_creates_refills_and_sweeps_leftovers() {
    let journal_dir = tempfile::tempdir().unwrap();
    let journal = || cella_sandbox::PoolJournal::new(journal_dir.path().join("pool"));
    let mgr = manager();
    assert_eq!(
        mgr.start_pools(journal(), vec![(SandboxSpec::default(), 2)])
            .await,
        0
    );
    wait_ready(&mgr, 2).await;
    assert_eq!(std::fs::read_dir(journal().dir()).unwrap().count(), 2);

    // A matching create (envs, metadata and lifetime are set at claim time) comes from the pool.
    let mut spec = SandboxSpec::default();
    spec.envs
        .insert("POOL_GREETING".into(), "hello from the pool".into());
    spec.lifetime = Some(Duration::from_secs(60));
    let sb = mgr.create(spec).await.expect("create");
    assert!(sb.from_pool, "a matching create must be served warm");
    assert!(sb.end_at().is_some(), "the claim sets the end time");
    let (out, _, end) = output(
        &run_to_end(
            &sb.envd,
            &start("/bin/sh", &["-c", "printf %s \"$POOL_GREETING\""]),
        )
        .await,
    );
    assert_eq!(out, "hello from the pool");
    assert_eq!(end.unwrap().exit_code, 0);
    let stats = &mgr.pool_stats()[0];
    assert_eq!((stats.hits, stats.misses), (1, 0), "{stats:?}");

    // A create with other limits is built cold and does not touch the pool.
    let mut other = SandboxSpec::default();
    other.limits.pids = Some(64);
    let cold = mgr.create(other).await.expect("cold create");
    assert!(!cold.from_pool);

    // The pool refills in the background, and the claimed sandbox left the journal.
    wait_ready(&mgr, 2).await;
    let journalled: Vec<String> = std::fs::read_dir(journal().dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(journalled.len(), 2, "{journalled:?}");
    assert!(!journalled.contains(&format!("{}.json", sb.id)));
    mgr.kill(&sb.id).await.unwrap();
    mgr.kill(&cold.id).await.unwrap();

    // A process that dies without draining its pools leaves ready sandboxes behind; the next
    // one destroys them at start.
    let pooled: Vec<String> = journalled
        .iter()
        .map(|f| f.trim_end_matches(".json").to_string())
        .collect();
    let next = manager();
    let swept = next.start_pools(journal(), vec![]).await;
    mgr.drain_pools().await; // the old manager's refill must not race the check below
    assert_eq!(swept, 2, "both leftovers destroyed");
    for id in &pooled {
        let dir = NativeConfig::with_helper(env!("CARGO_BIN_EXE_cella").into())
            .run_dir
            .join(id);
        assert!(!dir.exists(), "{} still exists", dir.display());
    }
    assert_eq!(std::fs::read_dir(journal().dir()).unwrap().count(), 0);
}

/// Children of this process named `comm` (from /proc).
fn children_named(comm: &str) -> Vec<i32> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let Some((name, rest)) = stat.split_once(") ") else {
                return false;
            };
            // Fields after the name: state, then the parent's pid; a zombie is gone already.
            let mut fields = rest.split(' ');
            let state = fields.next();
            name.ends_with(&format!("({comm}"))
                && state != Some("Z")
                && fields.next() == Some(me.as_str())
        })
        .collect()
}

#[tokio::test]
async fn a_dead_helper_spawner_is_replaced() {
    require_root!();
    let mgr = manager();
    // The spawner names itself once it runs.
    let mut before = children_named("cella-spawner");
    for _ in 0..200 {
        if !before.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        before = children_named("cella-spawner");
    }
    assert_eq!(
        before.len(),
        1,
        "the backend starts one spawner: {before:?}"
    );
    for pid in &before {
        // SAFETY: kill with integer arguments only.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    let sb = mgr
        .create(SandboxSpec::default())
        .await
        .expect("a create after the spawner died starts a new one");
    let (out, _, end) = output(&run_to_end(&sb.envd, &start("/bin/echo", &["alive"])).await);
    assert_eq!((out.as_str(), end.unwrap().exit_code), ("alive\n", 0));
    let after = children_named("cella-spawner");
    assert_eq!(after.len(), 1, "{after:?}");
    assert!(!before.contains(&after[0]));
    mgr.kill(&sb.id).await.unwrap();
}

#[tokio::test]
async fn the_sandbox_init_shows_no_host_command_line() {
    require_root!();
    let mgr = manager();
    let sb = mgr.create(SandboxSpec::default()).await.expect("create");
    let (out, _, end) = output(
        &run_to_end(
            &sb.envd,
            &start("/bin/sh", &["-c", "tr '\\0' '|' < /proc/1/cmdline"]),
        )
        .await,
    );
    assert_eq!(end.unwrap().exit_code, 0);
    assert!(out.starts_with("cella-sandbox|"), "{out:?}");
    assert!(
        !out.contains("cella/") && !out.contains("spawner"),
        "{out:?}"
    );
    mgr.kill(&sb.id).await.unwrap();
}
