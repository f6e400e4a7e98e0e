//! `cella serve` (the self-hosted, E2B-compatible control plane) and `cella keys` (API keys).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use cella_server::{Server, ServerConfig};

fn default_data_dir() -> PathBuf {
    cella_sandbox::native::NativeConfig::with_helper(PathBuf::new()).data_dir
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "E2B SDK users set E2B_API_URL and E2B_SANDBOX_URL to the printed address and E2B_API_KEY to a key from `cella keys create`."
)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "CELLA_LISTEN", default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Directory for the embedded database, keys and templates.
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
    /// Live sandboxes allowed per tenant.
    #[arg(long, env = "CELLA_MAX_SANDBOXES", default_value_t = 100)]
    max_sandboxes: u64,
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
    let data_dir = args.data_dir.unwrap_or_else(default_data_dir);
    let mut config = ServerConfig::with_data_dir(data_dir.clone());
    config.listen = args.listen;
    if let Some(url) = args.database_url {
        config.database_url = url;
    }
    config.domain = args.domain;
    config.auth = !args.no_auth;
    config.max_sandboxes_per_tenant = args.max_sandboxes;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let backend = super::local::native_backend()?;
        let server = Server::start(config, Arc::new(backend)).await?;
        let url = format!("http://{}", server.state.config.listen);
        say(&format!("cella serve: listening on {url} (data in {})", data_dir.display()));
        let (adopted, lost) = server.restored;
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
