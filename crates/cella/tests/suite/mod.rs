mod escape;
mod exec;
mod manager;
mod run;
mod skills;
mod support;
