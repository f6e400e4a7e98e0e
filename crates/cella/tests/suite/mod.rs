mod escape;
mod exec;
mod manager;
mod skills;
mod support;
