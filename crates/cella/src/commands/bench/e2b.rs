//! `cella bench e2b`: create → `commands.run("true")` → kill through the unmodified `e2b`
//! Python SDK against a `cella serve` with a warm pool, and the same cycle on the raw native
//! backend without any server, in one run: batches alternate between the two so machine noise
//! hits both alike, at each requested concurrency.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cella_sandbox::EnvdClient;
use cella_sandbox::backend::Backend;
use cella_sandbox::spec::SandboxSpec;
use serde::Serialize;

use super::Series;

/// The SDK side of the benchmark (kept in the repo as bench/e2b_sdk_bench.py).
const SDK_SCRIPT: &str = include_str!("../../../../../bench/e2b_sdk_bench.py");

#[derive(Debug, clap::Args)]
pub struct E2bBench {
    /// Sandboxes per series at each concurrency level.
    #[arg(long, default_value_t = 60)]
    runs: usize,
    /// Concurrency levels (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    concurrency: Vec<usize>,
    /// Ready sandboxes in the server's warm pool (0: every create is cold).
    #[arg(long, default_value_t = 8)]
    warm_pool: usize,
    /// Batches per series; server and raw-backend batches alternate.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// A Python with the `e2b` package [default: $CELLA_TEST_VENV/bin/python, else python3].
    #[arg(long)]
    python: Option<PathBuf>,
    /// Print results as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Level {
    concurrency: usize,
    server: Series,
    raw: Series,
    /// Server median over raw-backend median.
    ratio_p50: f64,
    server_sandboxes_per_s: f64,
    raw_sandboxes_per_s: f64,
    warm_pool_hits: u64,
    warm_pool_misses: u64,
}

#[derive(Debug, Serialize)]
struct Report {
    warm_pool: usize,
    levels: Vec<Level>,
    /// The target: p50 under 30 ms at concurrency 1 through the SDK.
    target_p50_c1_ms: f64,
    target_met: Option<bool>,
}

/// A `cella serve` child and its scratch directory, both gone on drop.
struct ServerUnderTest {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Drop for ServerUnderTest {
    fn drop(&mut self) {
        // SIGTERM lets the server drain its pool; SIGKILL only if it does not stop.
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl ServerUnderTest {
    fn start(warm_pool: usize) -> anyhow::Result<ServerUnderTest> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let dir = std::env::temp_dir().join(format!(
            "cella-bench-e2b-{}",
            cella_proto::ids::random_hex(6)
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let log = std::fs::File::create(dir.join("serve.log"))?;
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args([
            "serve",
            "--no-auth",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .arg("--data-dir")
        .arg(&dir)
        .env("CELLA_RUN_DIR", dir.join("run"))
        .env("CELLA_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
        if warm_pool > 0 {
            cmd.arg("--warm-pool").arg(format!("base={warm_pool}"));
        }
        let child = cmd.spawn().context("starting cella serve")?;
        let server = ServerUnderTest { child, dir, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                bail!(
                    "cella serve did not start listening; its log: {}",
                    server.dir.join("serve.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// One sample of the server's Prometheus metric `name{template="base"}`.
    fn metric(&self, name: &str) -> anyhow::Result<u64> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port))?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        let prefix = format!("{name}{{template=\"base\"}} ");
        Ok(text
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0))
    }

    /// Waits until the warm pool is full again (so each batch starts from the same state).
    fn wait_for_pool(&self, size: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.metric("cella_warm_pool_ready")? < size as u64 {
            if Instant::now() > deadline {
                bail!("the warm pool did not refill to {size} within 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

fn python(args: &E2bBench) -> anyhow::Result<PathBuf> {
    let py = match (&args.python, std::env::var_os("CELLA_TEST_VENV")) {
        (Some(p), _) => p.clone(),
        (None, Some(venv)) => Path::new(&venv).join("bin/python"),
        (None, None) => PathBuf::from("python3"),
    };
    let ok = Command::new(&py)
        .args(["-c", "import e2b"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        bail!(
            "{} cannot import the e2b SDK: create a virtualenv with `python3 -m venv v && v/bin/pip install e2b==2.63.0` and pass --python v/bin/python",
            py.display()
        );
    }
    Ok(py)
}

#[derive(serde::Deserialize)]
struct SdkBatch {
    ms: Vec<f64>,
    wall_s: f64,
    errors: Vec<String>,
}

fn sdk_batch(
    py: &Path,
    script: &Path,
    server: &ServerUnderTest,
    runs: usize,
    concurrency: usize,
    warmup: usize,
) -> anyhow::Result<SdkBatch> {
    let url = server.url();
    let out = Command::new(py)
        .arg(script)
        .args(["--runs", &runs.to_string()])
        .args(["--concurrency", &concurrency.to_string()])
        .args(["--warmup", &warmup.to_string()])
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env(
            "E2B_API_KEY",
            "e2b_0000000000000000000000000000000000000000",
        )
        .stdin(Stdio::null())
        .output()
        .context("running the SDK benchmark script")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let batch: SdkBatch = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .with_context(|| {
            format!(
                "the SDK benchmark printed no result (exit {}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    if let Some(e) = batch.errors.first() {
        bail!(
            "{} of {runs} SDK runs failed; first: {e}",
            batch.errors.len()
        );
    }
    Ok(batch)
}

/// `runs` cycles on the raw backend, `concurrency` at a time; per-cycle latencies and the wall
/// time of the batch.
async fn raw_batch(
    backend: &Arc<dyn Backend>,
    runs: usize,
    concurrency: usize,
) -> anyhow::Result<(Vec<Duration>, Duration)> {
    let spec = Arc::new(SandboxSpec::default());
    let permits = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let wall = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..runs {
        let (backend, spec, permits) = (backend.clone(), spec.clone(), permits.clone());
        tasks.spawn(async move {
            let _permit = permits.acquire_owned().await?;
            let t = Instant::now();
            let i = backend
                .create(&cella_proto::ids::new_sandbox_id(), &spec)
                .await?;
            super::run_true(&EnvdClient::for_transport(&i.transport)).await?;
            backend.kill(&i).await?;
            anyhow::Ok(t.elapsed())
        });
    }
    let mut samples = Vec::with_capacity(runs);
    while let Some(r) = tasks.join_next().await {
        samples.push(r??);
    }
    Ok((samples, wall.elapsed()))
}

/// Splits `runs` into `rounds` batch sizes that add up to `runs`.
fn batches(runs: usize, rounds: usize) -> Vec<usize> {
    let rounds = rounds.clamp(1, runs.max(1));
    (0..rounds)
        .map(|i| runs / rounds + usize::from(i < runs % rounds))
        .collect()
}

pub fn run(args: E2bBench) -> anyhow::Result<ExitCode> {
    if args.runs == 0 || args.concurrency.contains(&0) {
        bail!("--runs and every --concurrency level must be at least 1");
    }
    let py = python(&args)?;
    let server = ServerUnderTest::start(args.warm_pool)?;
    let script = server.dir.join("e2b_sdk_bench.py");
    std::fs::write(&script, SDK_SCRIPT)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let backend: Arc<dyn Backend> = Arc::new(super::super::local::native_backend()?);
    let say = |m: String| {
        if !args.json {
            eprintln!("cella bench e2b: {m}");
        }
    };
    // Warm the SDK, the server and the page cache before anything is timed.
    sdk_batch(&py, &script, &server, 0, 1, 2)?;
    let mut levels = Vec::new();
    for &c in &args.concurrency {
        let (mut server_ms, mut raw, mut server_wall, mut raw_wall) =
            (Vec::new(), Vec::new(), 0.0, Duration::ZERO);
        let hits0 = server.metric("cella_warm_pool_hits_total")?;
        let misses0 = server.metric("cella_warm_pool_misses_total")?;
        for (round, n) in batches(args.runs, args.rounds).into_iter().enumerate() {
            if args.warm_pool > 0 {
                server.wait_for_pool(args.warm_pool)?;
            }
            say(format!(
                "concurrency {c}, round {}: {n} sandboxes through the SDK",
                round + 1
            ));
            let b = sdk_batch(&py, &script, &server, n, c, 0)?;
            server_ms.extend(b.ms);
            server_wall += b.wall_s;
            say(format!(
                "concurrency {c}, round {}: {n} sandboxes on the raw backend",
                round + 1
            ));
            let (samples, wall) = rt.block_on(raw_batch(&backend, n, c))?;
            raw.extend(samples);
            raw_wall += wall;
        }
        let hits = server.metric("cella_warm_pool_hits_total")? - hits0;
        let misses = server.metric("cella_warm_pool_misses_total")? - misses0;
        let server_series = Series::from_ms(
            &format!(
                "SDK → cella serve (warm pool {}), concurrency {c}",
                args.warm_pool
            ),
            server_ms,
        );
        let raw_series = Series::from(
            &format!("raw native backend (no server, cold), concurrency {c}"),
            &raw,
        );
        levels.push(Level {
            concurrency: c,
            ratio_p50: server_series.p50_ms / raw_series.p50_ms,
            server_sandboxes_per_s: server_series.runs as f64 / server_wall.max(1e-9),
            raw_sandboxes_per_s: raw_series.runs as f64 / raw_wall.as_secs_f64().max(1e-9),
            server: server_series,
            raw: raw_series,
            warm_pool_hits: hits,
            warm_pool_misses: misses,
        });
    }
    let target = 30.0;
    let report = Report {
        warm_pool: args.warm_pool,
        target_met: levels
            .iter()
            .find(|l| l.concurrency == 1)
            .map(|l| l.server.p50_ms < target),
        target_p50_c1_ms: target,
        levels,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<58} {:>5} {:>9} {:>9} {:>9} {:>9}",
        "measurement", "runs", "p50 ms", "p90 ms", "p99 ms", "min ms"
    );
    for l in &report.levels {
        for s in [&l.server, &l.raw] {
            println!(
                "{:<58} {:>5} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
                s.name, s.runs, s.p50_ms, s.p90_ms, s.p99_ms, s.min_ms
            );
        }
        println!(
            "  concurrency {}: server/raw median {:.2}x; {:.1} vs {:.1} sandboxes/s; warm pool hits {} misses {}\n",
            l.concurrency,
            l.ratio_p50,
            l.server_sandboxes_per_s,
            l.raw_sandboxes_per_s,
            l.warm_pool_hits,
            l.warm_pool_misses
        );
    }
    if let Some(met) = report.target_met {
        println!(
            "target: SDK p50 under {target} ms at concurrency 1: {}",
            if met { "met" } else { "MISSED" }
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::batches;

    #[test]
    fn batches_add_up() {
        assert_eq!(batches(10, 3), vec![4, 3, 3]);
        assert_eq!(batches(2, 5), vec![1, 1]);
        assert_eq!(batches(7, 1), vec![7]);
        assert_eq!(batches(60, 3).iter().sum::<usize>(), 60);
    }
}
