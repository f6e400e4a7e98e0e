//! `cella bench`: latency benchmarks, each reported against a baseline measured in the same run
//! (interleaved, so machine noise hits both alike), with percentiles and ratios.

use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cella_proto::process::{ProcessConfig, ProcessEvent, StartRequest};
use cella_sandbox::EnvdClient;
use cella_sandbox::backend::Backend;
use cella_sandbox::spec::SandboxSpec;
use serde::Serialize;

mod e2b;

#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// Create → exec /bin/true → destroy, against raw bubblewrap doing the same.
    Sandbox(SandboxBench),
    /// Agent overhead per step, excluding model and tool time (zero-latency model, trivial tool).
    Agent(AgentBench),
    /// Create → commands.run("true") → kill through the e2b Python SDK against `cella serve`
    /// (warm pool), against the raw backend without a server, at several concurrencies.
    E2b(e2b::E2bBench),
}

#[derive(Debug, clap::Args)]
pub struct AgentBench {
    /// Tool-calling steps to measure.
    #[arg(long, default_value_t = 1000)]
    steps: usize,
    /// Print results as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct SandboxBench {
    /// Iterations of each measurement.
    #[arg(long, default_value_t = 50)]
    runs: usize,
    /// Print results as JSON.
    #[arg(long)]
    json: bool,
}

/// Percentiles of one series, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub name: String,
    pub runs: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub min_ms: f64,
}

impl Series {
    fn from(name: &str, samples: &[Duration]) -> Series {
        Self::from_ms(
            name,
            samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect(),
        )
    }

    fn from_ms(name: &str, mut ms: Vec<f64>) -> Series {
        ms.sort_by(f64::total_cmp);
        let pct = |p: f64| -> f64 {
            if ms.is_empty() {
                return f64::NAN;
            }
            let idx = ((p / 100.0) * (ms.len() - 1) as f64).round() as usize;
            ms[idx.min(ms.len() - 1)]
        };
        Series {
            name: name.into(),
            runs: ms.len(),
            p50_ms: pct(50.0),
            p90_ms: pct(90.0),
            p99_ms: pct(99.0),
            min_ms: ms.first().copied().unwrap_or(f64::NAN),
        }
    }
}

#[derive(Debug, Serialize)]
struct Report {
    series: Vec<Series>,
    /// cella in-process create→exec→destroy median over bwrap's median.
    ratio_inprocess_vs_bwrap: f64,
    /// `cella exec -- /bin/true` process median over `bwrap … /bin/true` process median.
    ratio_cli_vs_bwrap: f64,
    /// The same ratios against bwrap placed in cgroups with the same limits (equivalent
    /// resource isolation; the process joins them the way cella's helper does).
    ratio_inprocess_vs_bwrap_cgroup: f64,
    ratio_cli_vs_bwrap_cgroup: f64,
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Sandbox(args) => sandbox(args),
        BenchCommand::Agent(args) => agent(args),
        BenchCommand::E2b(args) => e2b::run(args),
    }
}

fn bwrap_command() -> anyhow::Result<std::process::Command> {
    let bwrap = ["/usr/bin/bwrap", "/bin/bwrap"].into_iter().find(|p| std::path::Path::new(p).exists()).context("bubblewrap (bwrap) is not installed: `apt-get install bubblewrap` provides the baseline")?;
    let mut c = std::process::Command::new(bwrap);
    // Equivalent isolation: every namespace, read-only /usr, fresh /proc, minimal /dev, private
    // /tmp and home, all capabilities dropped, a new session.
    c.args([
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--ro-bind",
        "/usr",
        "/usr",
    ]);
    for l in ["bin", "sbin", "lib", "lib64"] {
        if let Ok(t) = std::fs::read_link(format!("/{l}")) {
            c.args(["--symlink", &t.to_string_lossy(), &format!("/{l}")]);
        }
    }
    c.args([
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--tmpfs",
        "/home/user",
        "--chdir",
        "/home/user",
        "/bin/true",
    ]);
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Ok(c)
}

/// bwrap inside fresh cgroups with the same limits as a cella sandbox: the baseline with
/// equivalent resource isolation (cgroup creation, limits, joining, removal are all timed).
fn time_bwrap_in_cgroup(n: usize, spec: &SandboxSpec) -> anyhow::Result<Duration> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;
    let t = Instant::now();
    let (cg, _warnings) =
        cella_sandbox::native::cgroup::CgroupPaths::create(&format!("benchbwrap{n}"), &spec.limits);
    let files: Vec<std::ffi::CString> = cg
        .join_files()
        .iter()
        .filter_map(|p| std::ffi::CString::new(p.as_os_str().as_bytes()).ok())
        .collect();
    let mut cmd = bwrap_command()?;
    // SAFETY: between fork and exec the closure only calls open, write and close (async-signal-
    // safe) on paths prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            for f in &files {
                let fd = libc::open(f.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
                libc::close(fd);
                if !ok {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let status = cmd.status().context("running bwrap in a cgroup")?;
    cg.remove();
    let d = t.elapsed();
    if !status.success() {
        bail!("bwrap in a cgroup failed: {status}");
    }
    Ok(d)
}

fn time_process(mut cmd: std::process::Command) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let status = cmd.status().context("running the benchmark process")?;
    let d = t.elapsed();
    if !status.success() {
        bail!("benchmark process {cmd:?} failed: {status}");
    }
    Ok(d)
}

async fn run_true(client: &EnvdClient) -> anyhow::Result<()> {
    let req = StartRequest {
        process: Some(ProcessConfig {
            cmd: "/bin/true".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut s = client.start(&req, None).await?;
    while let Some(ev) = s.next().await {
        if let ProcessEvent::End(end) = ev? {
            if end.exit_code != 0 {
                bail!("/bin/true failed in the sandbox: {}", end.status);
            }
            return Ok(());
        }
    }
    bail!("no end event")
}

fn sandbox(args: SandboxBench) -> anyhow::Result<ExitCode> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let exe = std::env::current_exe()?;
    let rt = super::local::runtime()?;
    let backend = super::local::native_backend()?;
    let spec = SandboxSpec::default();
    let (mut inproc, mut bw, mut cli, mut bw_cli, mut exec_rt) =
        (vec![], vec![], vec![], vec![], vec![]);
    let mut bw_cg = vec![];
    // Warm-up: page cache, template preparation.
    rt.block_on(async {
        let i = backend
            .create(&cella_proto::ids::new_sandbox_id(), &spec)
            .await?;
        let _ = backend.kill(&i).await;
        anyhow::Ok(())
    })?;
    let _ = time_process(bwrap_command()?)?;
    for n in 0..args.runs {
        if !args.json {
            eprint!("\rcella bench sandbox: run {}/{}", n + 1, args.runs);
        }
        // In-process create → exec → destroy (what the server pays per sandbox).
        let d = rt.block_on(async {
            let t = Instant::now();
            let i = backend
                .create(&cella_proto::ids::new_sandbox_id(), &spec)
                .await?;
            let client = EnvdClient::for_transport(&i.transport);
            run_true(&client).await?;
            backend.kill(&i).await?;
            anyhow::Ok(t.elapsed())
        })?;
        inproc.push(d);
        bw.push(time_process(bwrap_command()?)?);
        let mut c = std::process::Command::new(&exe);
        c.args(["exec", "--", "/bin/true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cli.push(time_process(c)?);
        bw_cli.push(time_process(bwrap_command()?)?);
        bw_cg.push(time_bwrap_in_cgroup(n, &spec)?);
    }
    // Exec round trip on an already running sandbox.
    rt.block_on(async {
        let i = backend
            .create(&cella_proto::ids::new_sandbox_id(), &spec)
            .await?;
        let client = EnvdClient::for_transport(&i.transport);
        run_true(&client).await?;
        for _ in 0..args.runs.max(20) {
            let t = Instant::now();
            run_true(&client).await?;
            exec_rt.push(t.elapsed());
        }
        backend.kill(&i).await?;
        anyhow::Ok(())
    })?;
    if !args.json {
        eprintln!();
    }
    let series = vec![
        Series::from("cella create+exec+destroy (in-process)", &inproc),
        Series::from("bwrap /bin/true (baseline, same run)", &bw),
        Series::from("cella exec -- /bin/true (whole process)", &cli),
        Series::from("bwrap /bin/true (baseline for the CLI)", &bw_cli),
        Series::from("exec /bin/true in a running sandbox", &exec_rt),
        Series::from("bwrap /bin/true in cgroups with the same limits", &bw_cg),
    ];
    let report = Report {
        ratio_inprocess_vs_bwrap_cgroup: series[0].p50_ms / series[5].p50_ms,
        ratio_cli_vs_bwrap_cgroup: series[2].p50_ms / series[5].p50_ms,
        ratio_inprocess_vs_bwrap: series[0].p50_ms / series[1].p50_ms,
        ratio_cli_vs_bwrap: series[2].p50_ms / series[3].p50_ms,
        series,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{:<42} {:>5} {:>9} {:>9} {:>9} {:>9}",
            "measurement", "runs", "p50 ms", "p90 ms", "p99 ms", "min ms"
        );
        for s in &report.series {
            println!(
                "{:<48} {:>5} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
                s.name, s.runs, s.p50_ms, s.p90_ms, s.p99_ms, s.min_ms
            );
        }
        println!(
            "\nratio (median) cella in-process / bwrap: {:.2}x",
            report.ratio_inprocess_vs_bwrap
        );
        println!(
            "ratio (median) cella exec CLI / bwrap:   {:.2}x",
            report.ratio_cli_vs_bwrap
        );
        println!(
            "ratio (median) cella in-process / bwrap in cgroups: {:.2}x",
            report.ratio_inprocess_vs_bwrap_cgroup
        );
        println!(
            "ratio (median) cella exec CLI / bwrap in cgroups:   {:.2}x",
            report.ratio_cli_vs_bwrap_cgroup
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `cella bench agent`: see `cella_agent::bench`.
fn agent(args: AgentBench) -> anyhow::Result<ExitCode> {
    if args.steps < 2 {
        bail!("--steps must be at least 2");
    }
    let rt = super::local::runtime()?;
    let r = rt
        .block_on(cella_agent::bench::agent_overhead(args.steps, None))
        .map_err(anyhow::Error::msg)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "agent overhead per step ({} steps, zero-latency model, trivial tool, events serialized to JSON):",
            r.steps
        );
        println!(
            "  median {:.1} µs · p90 {:.1} µs · p99 {:.1} µs · max {:.1} µs · mean {:.1} µs",
            r.median_us, r.p90_us, r.p99_us, r.max_us, r.mean_us
        );
        println!(
            "  target: median < 5 ms: {}",
            if r.median_us < 5000.0 {
                "met"
            } else {
                "MISSED"
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}
