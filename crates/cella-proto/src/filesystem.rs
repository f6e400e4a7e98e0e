//! `filesystem.Filesystem` messages (E2B envd `filesystem.proto`) in proto3 canonical JSON.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `filesystem.FileType`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileType {
    #[default]
    #[serde(rename = "FILE_TYPE_UNSPECIFIED")]
    Unspecified,
    #[serde(rename = "FILE_TYPE_FILE")]
    File,
    #[serde(rename = "FILE_TYPE_DIRECTORY")]
    Directory,
    #[serde(rename = "FILE_TYPE_SYMLINK")]
    Symlink,
}

/// `filesystem.EventType`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    #[default]
    #[serde(rename = "EVENT_TYPE_UNSPECIFIED")]
    Unspecified,
    #[serde(rename = "EVENT_TYPE_CREATE")]
    Create,
    #[serde(rename = "EVENT_TYPE_WRITE")]
    Write,
    #[serde(rename = "EVENT_TYPE_REMOVE")]
    Remove,
    #[serde(rename = "EVENT_TYPE_RENAME")]
    Rename,
    #[serde(rename = "EVENT_TYPE_CHMOD")]
    Chmod,
}

/// proto3 JSON carries int64 as a decimal string; parsers accept numbers too.
pub mod int64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(s) => s.parse().map_err(serde::de::Error::custom),
            serde_json::Value::Number(n) => n
                .as_i64()
                .ok_or_else(|| serde::de::Error::custom("int64 out of range")),
            serde_json::Value::Null => Ok(0),
            other => Err(serde::de::Error::custom(format!(
                "expected int64, got {other}"
            ))),
        }
    }
}

/// Everything the SDK reads about a file (`EntryInfo`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EntryInfo {
    pub name: String,
    #[serde(rename = "type")]
    pub file_type: FileType,
    pub path: String,
    #[serde(with = "int64")]
    pub size: i64,
    pub mode: u32,
    pub permissions: String,
    pub owner: String,
    pub group: String,
    /// RFC 3339 timestamp (google.protobuf.Timestamp's JSON form).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modified_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    pub is_symlink: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PathRequest {
    pub path: String,
}

/// `StatRequest`, `MakeDirRequest` and `RemoveRequest` all carry just a path.
pub type StatRequest = PathRequest;
pub type MakeDirRequest = PathRequest;
pub type RemoveRequest = PathRequest;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EntryResponse {
    pub entry: Option<EntryInfo>,
}

/// `StatResponse`, `MakeDirResponse` and `MoveResponse` all carry one entry.
pub type StatResponse = EntryResponse;
pub type MakeDirResponse = EntryResponse;
pub type MoveResponse = EntryResponse;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MoveRequest {
    pub source: String,
    pub destination: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ListDirRequest {
    pub path: String,
    pub depth: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ListDirResponse {
    pub entries: Vec<EntryInfo>,
}

/// `WatchDirRequest` and `CreateWatcherRequest` have the same fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WatchRequest {
    pub path: String,
    pub recursive: bool,
    pub include_entry: bool,
    pub allow_network_mounts: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FilesystemEvent {
    pub name: String,
    #[serde(rename = "type")]
    pub event_type: EventType,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

/// One message of a `WatchDir` stream.
// A wire message built and serialized at once: boxing the large variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WatchDirEvent {
    Start {},
    Filesystem(FilesystemEvent),
    Keepalive {},
}

/// `event` is a proto `oneof`, which proto3 JSON flattens: `{"start": {}}`, not
/// `{"event": {"start": {}}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchDirResponse {
    #[serde(flatten)]
    pub event: WatchDirEvent,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WatcherIdMessage {
    pub watcher_id: String,
}

/// `CreateWatcherResponse`, `GetWatcherEventsRequest` and `RemoveWatcherRequest`.
pub type CreateWatcherResponse = WatcherIdMessage;
pub type GetWatcherEventsRequest = WatcherIdMessage;
pub type RemoveWatcherRequest = WatcherIdMessage;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GetWatcherEventsResponse {
    pub events: Vec<FilesystemEvent>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_info_json_shape() {
        let e = EntryInfo {
            name: "a.txt".into(),
            file_type: FileType::File,
            path: "/home/user/a.txt".into(),
            size: 5,
            mode: 0o644,
            permissions: "-rw-r--r--".into(),
            owner: "user".into(),
            group: "user".into(),
            modified_time: Some("2026-08-21T10:00:00Z".into()),
            ..Default::default()
        };
        let json = serde_json::to_value(&e).expect("ser");
        assert_eq!(json["type"], "FILE_TYPE_FILE");
        assert_eq!(json["size"], "5");
        assert_eq!(json["modifiedTime"], "2026-08-21T10:00:00Z");
        let back: EntryInfo = serde_json::from_value(json).expect("de");
        assert_eq!(back, e);
        let w = WatchDirResponse {
            event: WatchDirEvent::Start {},
        };
        assert_eq!(serde_json::to_string(&w).expect("ser"), r#"{"start":{}}"#);
    }
}
