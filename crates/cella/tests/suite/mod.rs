mod escape;
mod exec;
mod manager;
mod support;
