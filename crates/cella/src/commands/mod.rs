//! One module per `cella` subcommand.

pub mod bench;
pub mod doctor;
pub mod exec;
pub mod guest;
pub mod jobs;
pub mod local;
pub mod run;
pub mod sandbox;
pub mod serve;
pub mod shell;
pub mod skills;
pub mod template;
