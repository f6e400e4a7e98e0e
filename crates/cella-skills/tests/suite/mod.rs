mod anthropic;
mod discovery;
mod package;
mod properties;
mod render;
mod support;
mod validate;
mod yaml;
