//! Sandbox network policies as E2B clients express them: `allow_internet_access` and
//! `network {allowOut, denyOut, …}` at create, `PUT /sandboxes/{id}/network` while running, the
//! `network` fields of `SandboxDetail`, and every refused connection written to the sandbox's
//! logs.
//!
//! E2B's `allowOut` wins over `denyOut`; cella's deny-list wins. The common E2B idiom — deny all
//! traffic (`0.0.0.0/0`) and allow a list — maps to cella's default-deny with that allow-list;
//! other `denyOut` entries become deny rules and win over overlapping allows.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use cella_sandbox::SandboxSpec;
use cella_sandbox::network::{NetworkPolicy, Rule};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Caller;
use crate::error::{ApiError, json_rejection};
use crate::lifecycle;
use crate::state::AppState;

/// `SandboxNetworkConfig` / `SandboxNetworkUpdateConfig`; fields other helpers own
/// (`allowPublicTraffic`, `maskRequestHost`) are accepted and left to them.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    pub allow_out: Option<Vec<String>>,
    pub deny_out: Option<Vec<String>>,
    pub egress_proxy: Option<Value>,
    pub rules: Option<Value>,
    #[serde(rename = "allow_internet_access", alias = "allowInternetAccess")]
    pub allow_internet_access: Option<bool>,
    /// `false`: the sandbox's ports answer only requests carrying its traffic access token
    /// (see `ports.rs`); not an egress rule.
    pub allow_public_traffic: Option<bool>,
}

/// What a create request's network settings decide.
#[derive(Debug)]
pub struct CreateNetwork {
    pub policy: NetworkPolicy,
    /// E2B's `allowPublicTraffic` (default true).
    pub public_traffic: bool,
}

fn is_all_traffic(entry: &str) -> bool {
    matches!(entry.trim(), "0.0.0.0/0" | "::/0")
}

fn parse_rules(field: &str, entries: &[String]) -> Result<Vec<Rule>, ApiError> {
    entries
        .iter()
        .map(|e| {
            e.parse::<Rule>()
                .map_err(|msg| ApiError::bad_request(format!("network.{field}: {msg}")))
        })
        .collect()
}

/// The policy a config describes; `internet` is what applies when the config says nothing
/// about it (create: `allow_internet_access`, update: the sandbox's current setting).
pub fn policy_from(cfg: &NetworkConfig, internet: bool) -> Result<NetworkPolicy, ApiError> {
    if cfg.egress_proxy.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(ApiError::bad_request(
            "network.egressProxy is not supported: cella's own egress proxy enforces the policy",
        ));
    }
    if cfg
        .rules
        .as_ref()
        .is_some_and(|v| v.as_object().is_some_and(|o| !o.is_empty()))
    {
        return Err(ApiError::bad_request(
            "network.rules (request transforms) are not supported",
        ));
    }
    let deny_out = cfg.deny_out.clone().unwrap_or_default();
    let deny_all = deny_out.iter().any(|e| is_all_traffic(e));
    let deny: Vec<String> = deny_out
        .into_iter()
        .filter(|e| !is_all_traffic(e))
        .collect();
    let allow = cfg.allow_out.clone().unwrap_or_default();
    let allow_internet = !deny_all && cfg.allow_internet_access.unwrap_or(internet);
    Ok(NetworkPolicy {
        allow_internet,
        allow: parse_rules("allowOut", &allow)?,
        deny: parse_rules("denyOut", &deny)?,
    })
}

/// The policy of a new sandbox: no network unless the client asks for it.
pub fn policy_for_create(
    allow_internet_access: Option<bool>,
    network: Option<&Value>,
) -> Result<CreateNetwork, ApiError> {
    let cfg: NetworkConfig = match network {
        None | Some(Value::Null) => NetworkConfig::default(),
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|e| ApiError::bad_request(format!("invalid network: {e}")))?,
    };
    Ok(CreateNetwork {
        policy: policy_from(&cfg, allow_internet_access.unwrap_or(false))?,
        public_traffic: cfg.allow_public_traffic.unwrap_or(true),
    })
}

/// `allowInternetAccess` and `network` of a `SandboxDetail`.
pub fn describe(spec: &Value, detail: &mut Value) {
    let spec: SandboxSpec = serde_json::from_value(spec.clone()).unwrap_or_default();
    let p = spec.network;
    let list = |rules: &[Rule]| rules.iter().map(|r| r.to_string()).collect::<Vec<_>>();
    let mut deny = list(&p.deny);
    if !p.allow_internet {
        deny.insert(0, "0.0.0.0/0".into());
    }
    detail["allowInternetAccess"] = json!(p.allow_internet);
    detail["network"] = json!({ "allowOut": list(&p.allow), "denyOut": deny });
}

/// `PUT /sandboxes/{id}/network`: replaces the egress rules; new connections follow them.
pub async fn update(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    payload: Result<Json<NetworkConfig>, JsonRejection>,
) -> Result<StatusCode, ApiError> {
    let cfg = payload.map(|Json(c)| c).map_err(json_rejection)?;
    let record = lifecycle::live_record(&state, &caller, &id).await?;
    let mut spec: SandboxSpec = serde_json::from_value(record.spec.clone())
        .map_err(|e| ApiError::internal(format!("stored spec of sandbox {id}: {e}")))?;
    let policy = policy_from(&cfg, spec.network.allow_internet)?;
    state.manager.set_network(&id, &policy)?;
    spec.network = policy.clone();
    let value = serde_json::to_value(&spec)
        .map_err(|e| ApiError::internal(format!("encoding the spec of sandbox {id}: {e}")))?;
    state.store.set_sandbox_spec(&id, &value).await?;
    lifecycle::log(
        &state,
        &id,
        cella_store::LogLevel::Info,
        format!("network policy set to {policy}"),
    )
    .await;
    Ok(StatusCode::NO_CONTENT)
}

/// Writes every refused connection to its sandbox's logs (tracing already has it).
pub fn log_denials(state: &AppState) {
    let Some(mut rx) = state.manager.backend().network_denials() else {
        return;
    };
    let state = state.clone();
    tokio::spawn(async move {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            match rx.recv().await {
                Ok(d) => {
                    let address = d.address.map(|a| format!(" ({a})")).unwrap_or_default();
                    lifecycle::log(
                        &state,
                        &d.sandbox,
                        cella_store::LogLevel::Warn,
                        format!("egress denied: {}{address}: {}", d.destination, d.rule),
                    )
                    .await;
                }
                Err(RecvError::Lagged(n)) => {
                    tracing::warn!(target: "cella::network", "{n} egress denials not written to sandbox logs (too many at once)");
                }
                Err(RecvError::Closed) => return,
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2b_shapes() {
        let c = policy_for_create(None, None).expect("default");
        assert!(c.policy.is_deny_all());
        assert!(
            c.public_traffic,
            "ports are public unless allowPublicTraffic is false"
        );
        let c =
            policy_for_create(None, Some(&json!({"allowPublicTraffic": false}))).expect("private");
        assert!(!c.public_traffic);
        assert!(c.policy.is_deny_all());
        assert!(
            policy_for_create(Some(true), None)
                .expect("internet")
                .policy
                .allow_internet
        );
        let p = policy_for_create(
            Some(true),
            Some(&json!({"allowOut": ["api.example.com", "1.1.1.1"], "denyOut": ["0.0.0.0/0"]})),
        )
        .expect("idiom")
        .policy;
        assert!(!p.allow_internet);
        assert_eq!(p.allow.len(), 2);
        assert!(p.deny.is_empty());
        let p = policy_for_create(Some(true), Some(&json!({"denyOut": ["10.0.0.0/8"]})))
            .expect("deny")
            .policy;
        assert!(p.allow_internet);
        assert_eq!(p.deny[0].to_string(), "10.0.0.0/8");
        let e = policy_for_create(None, Some(&json!({"allowOut": ["bad name"]}))).expect_err("bad");
        assert!(e.message.contains("network.allowOut"), "{}", e.message);
        assert!(
            policy_for_create(None, Some(&json!({"egressProxy": {"address": "x:1"}}))).is_err()
        );
        assert!(policy_for_create(None, Some(&json!({"allowOut": "x"}))).is_err());
    }

    #[test]
    fn describe_round_trips_through_the_e2b_shape() {
        let spec = SandboxSpec {
            network: "allow:a.test;deny:10.0.0.0/8".parse().expect("policy"),
            ..SandboxSpec::default()
        };
        let mut v = json!({});
        describe(&serde_json::to_value(&spec).expect("spec"), &mut v);
        assert_eq!(v["allowInternetAccess"], json!(false));
        let cfg: NetworkConfig = serde_json::from_value(v["network"].clone()).expect("cfg");
        assert_eq!(policy_from(&cfg, true).expect("policy"), spec.network);
    }
}
