//! `cella serve` (the self-hosted, E2B-compatible control plane) and `cella keys` (API keys).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use cella_server::config::FileConfig;
use cella_server::{Server, ServerConfig};

pub(crate) fn default_data_dir() -> PathBuf {
    cella_sandbox::native::NativeConfig::with_helper(PathBuf::new()).data_dir
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Settings come from defaults, then the --config file (TOML), then CELLA_* environment variables, then flags; flags win.\n\nE2B SDK users set E2B_API_URL and E2B_SANDBOX_URL to the printed address and E2B_API_KEY to a key from `cella keys create`."
)]
pub struct ServeArgs {
    /// TOML configuration file (keys: listen, data_dir, database_url, domain, auth,
    /// max_sandboxes_per_tenant, default_timeout, max_timeout, [warm_pools]).
    #[arg(long, env = "CELLA_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:3000].
    #[arg(long, env = "CELLA_LISTEN")]
    listen: Option<SocketAddr>,
    /// Directory for the embedded database, keys and templates [default: /var/lib/cella, or
    /// ~/.local/share/cella when not root].
    #[arg(long, env = "CELLA_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Database: sqlite://PATH (default: <data-dir>/cella.db) or postgres://USER@HOST/DB.
    #[arg(long, env = "CELLA_DATABASE_URL")]
    database_url: Option<String>,
    /// Also route `<port>-<sandbox id>.<domain>` hosts to sandboxes.
    #[arg(long, env = "CELLA_DOMAIN")]
    domain: Option<String>,
    /// Accept requests without API keys (only allowed on a loopback address).
    #[arg(long)]
    no_auth: bool,
    /// Live sandboxes allowed per tenant [default: 100].
    #[arg(long, env = "CELLA_MAX_SANDBOXES")]
    max_sandboxes: Option<u64>,
    /// Keep SIZE ready sandboxes of TEMPLATE so creates are served warm (repeatable; e.g.
    /// --warm-pool base=4). Replaces the config file's [warm_pools].
    #[arg(long = "warm-pool", env = "CELLA_WARM_POOL", value_delimiter = ',', value_name = "TEMPLATE=SIZE", value_parser = cella_server::config::parse_warm_pool)]
    warm_pools: Vec<(String, usize)>,
    /// Lifetime of a sandbox whose create names none, e.g. 5m [default: 5m].
    #[arg(long, env = "CELLA_DEFAULT_TIMEOUT", value_parser = cella_sandbox::spec::parse_duration)]
    default_timeout: Option<std::time::Duration>,
    /// Longest lifetime a create or timeout request may ask for [default: 24h].
    #[arg(long, env = "CELLA_MAX_TIMEOUT", value_parser = cella_sandbox::spec::parse_duration)]
    max_timeout: Option<std::time::Duration>,
    #[command(flatten)]
    jobs: super::jobs::ServeJobsArgs,
}

impl ServeArgs {
    /// Defaults, then the file, then environment and flags (clap already merged those two).
    fn resolve(self) -> anyhow::Result<ServerConfig> {
        let mut file = match &self.config {
            Some(path) => FileConfig::load(path).map_err(anyhow::Error::msg)?,
            None => FileConfig::default(),
        };
        // The flag's data directory replaces the file's before the file is resolved, so the
        // default database (under the data directory) follows it.
        if let Some(dir) = self.data_dir {
            file.data_dir = Some(dir);
        }
        let mut config = file
            .resolve(default_data_dir())
            .map_err(anyhow::Error::msg)?;
        if let Some(v) = self.listen {
            config.listen = v;
        }
        if let Some(v) = self.database_url {
            config.database_url = v;
        }
        if let Some(v) = self.domain {
            config.domain = Some(v);
        }
        if self.no_auth {
            config.auth = false;
        }
        if let Some(v) = self.max_sandboxes {
            config.max_sandboxes_per_tenant = v;
        }
        if !self.warm_pools.is_empty() {
            config.warm_pools = self.warm_pools.into_iter().collect();
        }
        if let Some(v) = self.default_timeout {
            config.default_timeout_secs = v.as_secs();
        }
        if let Some(v) = self.max_timeout {
            config.max_timeout_secs = v.as_secs();
        }
        if config.default_timeout_secs == 0 || config.default_timeout_secs > config.max_timeout_secs
        {
            anyhow::bail!(
                "the default timeout ({}s) must be between 1s and the maximum timeout ({}s)",
                config.default_timeout_secs,
                config.max_timeout_secs
            );
        }
        config.jobs = self.jobs.config()?;
        Ok(config)
    }
}

/// Writes a line to stderr, ignoring a closed stderr (a server must not die because whoever
/// started it stopped reading).
fn say(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{text}");
}

/// Structured logs on stderr; `CELLA_LOG` (or `RUST_LOG`) sets the filter, `info` by default.
fn init_logging() {
    let filter = std::env::var("CELLA_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        // A closed stderr must not turn into a panic (tracing reports write errors with eprintln).
        .log_internal_errors(false)
        .try_init();
}

pub fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    let config = args.resolve()?;
    let data_dir = config.data_dir.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let backend = super::local::native_backend_in(Some(&data_dir))?;
        let server = Server::start(config, Arc::new(backend)).await?;
        let url = format!("http://{}", server.state.config.listen);
        say(&format!("cella serve: listening on {url} (data in {})", data_dir.display()));
        let (adopted, lost) = server.restored;
        if server.interrupted_jobs > 0 {
            say(&format!("cella serve: {} jobs were running when the previous server stopped; they ended as errors (interrupted by restart)", server.interrupted_jobs));
        }
        if adopted + lost > 0 {
            say(&format!("cella serve: reattached {adopted} running sandboxes; {lost} had ended while the server was down"));
        }
        say(&format!("\nexport E2B_API_URL={url}\nexport E2B_SANDBOX_URL={url}"));
        match &server.new_admin_key {
            Some(key) => say(&format!("export E2B_API_KEY={key}\n\n(first start: this admin key was saved to {} and is not shown again)\n", data_dir.join("admin.key").display())),
            None if server.state.config.auth => say(&format!("export E2B_API_KEY=<a key from `cella keys create --tenant NAME` or {}>\n", data_dir.join("admin.key").display())),
            None => say("export E2B_API_KEY=e2b_0000000000000000000000000000000000000000   # any key: auth is off\n"),
        }
        server.serve(shutdown_signal()).await?;
        say("cella serve: stopped; running sandboxes keep running and are reattached at the next start");
        anyhow::Ok(ExitCode::SUCCESS)
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum KeysCommand {
    /// Create an API key for a tenant (created if new) and print it once.
    Create {
        /// Tenant the key belongs to.
        #[arg(long)]
        tenant: String,
        /// A label to recognise the key by.
        #[arg(long, default_value = "cli")]
        label: String,
        #[arg(long, env = "CELLA_DATA_DIR")]
        data_dir: Option<PathBuf>,
        #[arg(long, env = "CELLA_DATABASE_URL")]
        database_url: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn keys(cmd: KeysCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        KeysCommand::Create {
            tenant,
            label,
            data_dir,
            database_url,
            json,
        } => {
            let data_dir = data_dir.unwrap_or_else(default_data_dir);
            let url = database_url
                .unwrap_or_else(|| ServerConfig::with_data_dir(data_dir.clone()).database_url);
            std::fs::create_dir_all(&data_dir)
                .with_context(|| format!("creating {}", data_dir.display()))?;
            let rt = super::local::runtime()?;
            rt.block_on(async {
                let store = cella_store::Store::open(&url).await.with_context(|| format!("opening the store at {url}"))?;
                let t = store.ensure_tenant(&tenant).await?;
                let key = store.create_api_key(&t.id, &label).await?;
                if json {
                    println!("{}", serde_json::json!({ "key": key.plaintext, "key_id": key.record.id, "tenant": t.name, "tenant_id": t.id }));
                } else {
                    println!("{}", key.plaintext);
                }
                anyhow::Ok(ExitCode::SUCCESS)
            })
        }
    }
}
