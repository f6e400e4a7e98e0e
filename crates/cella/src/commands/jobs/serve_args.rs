//! The `cella serve` options of the job runner.

use std::time::Duration;

use cella_sandbox::spec;
use cella_server::jobs::JobsConfig;

#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Jobs")]
pub struct ServeJobsArgs {
    /// This node's name in the job queue (two servers sharing a database need different ones).
    #[arg(long = "node", env = "CELLA_NODE")]
    node: Option<String>,
    /// Most jobs running on this server at once.
    #[arg(
        long = "jobs-max-running",
        env = "CELLA_JOBS_MAX_RUNNING",
        default_value_t = 8
    )]
    max_running: u32,
    /// Most jobs of one tenant running at once.
    #[arg(
        long = "jobs-max-per-tenant",
        env = "CELLA_JOBS_MAX_PER_TENANT",
        default_value_t = 4
    )]
    max_per_tenant: u32,
    /// Time limit of a job that sets none (e.g. 30m).
    #[arg(long = "jobs-timeout", env = "CELLA_JOBS_TIMEOUT", default_value = "30m", value_parser = spec::parse_duration)]
    timeout: Duration,
    /// A running job with no event for this long is cancelled (e.g. 10m, 90s).
    #[arg(long = "jobs-watchdog", env = "CELLA_JOBS_WATCHDOG", default_value = "10m", value_parser = spec::parse_duration)]
    watchdog: Duration,
    /// Runs of a job in all when runs fail on transient model errors.
    #[arg(
        long = "jobs-max-attempts",
        env = "CELLA_JOBS_MAX_ATTEMPTS",
        default_value_t = 3
    )]
    max_attempts: u32,
    /// Largest workspace served as artifacts.zip (e.g. 256M).
    #[arg(long = "jobs-artifacts-max", env = "CELLA_JOBS_ARTIFACTS_MAX", default_value = "256M", value_parser = spec::parse_size)]
    artifacts_max: u64,
}

impl ServeJobsArgs {
    /// The runner's configuration; errors say which option is wrong.
    pub fn config(&self) -> anyhow::Result<JobsConfig> {
        let mut c = JobsConfig::default();
        if let Some(node) = self
            .node
            .as_deref()
            .map(str::trim)
            .filter(|n| !n.is_empty())
        {
            c.node = node.to_owned();
        }
        if self.max_running == 0 || self.max_per_tenant == 0 {
            anyhow::bail!("--jobs-max-running and --jobs-max-per-tenant must be at least 1");
        }
        if self.max_attempts == 0 {
            anyhow::bail!("--jobs-max-attempts must be at least 1");
        }
        if self.watchdog < Duration::from_secs(1) {
            anyhow::bail!("--jobs-watchdog must be at least 1s");
        }
        c.max_running = self.max_running;
        c.max_running_per_tenant = self.max_per_tenant;
        c.default_timeout = self.timeout.min(c.max_timeout);
        c.watchdog = self.watchdog;
        c.max_attempts = self.max_attempts;
        c.artifacts_max_bytes = self.artifacts_max;
        Ok(c)
    }
}
