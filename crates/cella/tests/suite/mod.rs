mod e2b_sdk;
mod escape;
mod exec;
mod manager;
mod run;
mod skills;
mod skills_registry;
mod support;
