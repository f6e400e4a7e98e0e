//! serde helpers for protobuf `bytes` fields, which proto3 JSON carries as standard base64.
//! Decoding also accepts the URL-safe alphabet and missing padding, as protobuf JSON parsers must.

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serializer};

/// Encodes bytes as standard padded base64.
pub fn encode(data: &[u8]) -> String {
    STANDARD.encode(data)
}

/// Decodes any of the base64 alphabets proto3 JSON allows.
pub fn decode(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    STANDARD
        .decode(text)
        .or_else(|_| STANDARD_NO_PAD.decode(text))
        .or_else(|_| URL_SAFE.decode(text))
        .or_else(|_| URL_SAFE_NO_PAD.decode(text))
}

pub fn serialize<S: Serializer>(data: &Bytes, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&encode(data))
}

pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Bytes, D::Error> {
    let text = String::deserialize(deserializer)?;
    decode(&text)
        .map(Bytes::from)
        .map_err(|e| serde::de::Error::custom(format!("invalid base64 in bytes field: {e}")))
}
