mod bench;
mod context;
mod limits;
mod support;
mod tool_loop;
mod wire;
