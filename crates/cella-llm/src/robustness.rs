//! Test-only: the decoders never panic, whatever bytes arrive. Real streams of both formats are
//! mutated (bytes flipped, ranges cut or repeated, SSE/JSON punctuation inserted) with a fixed
//! seed and fed, in random chunk sizes, through the SSE decoder, the wire decoders and the
//! response assembler.

use crate::anthropic::{self, EventDecoder};
use crate::event::ResponseAssembler;
use crate::http::WireDecoder;
use crate::openai::{self, ChunkDecoder};
use crate::sse::SseDecoder;

const OPENAI_STREAM: &str = concat!(
    "data: {\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hi ✓\"},\"finish_reason\":null}]}\n\n",
    ": keep-alive\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"bash\",\"arguments\":\"{\\\"cmd\\\":\"}}]}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"b\",\"function\":{\"name\":\"ls\",\"arguments\":\"{}\"}}]}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"ls\\\"}\"}}]}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\n",
    "data: [DONE]\n\n",
);

const ANTHROPIC_STREAM: &str = concat!(
    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"c\",\"content\":[],\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n",
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hé\"}}\n\n",
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: ping\ndata: {\"type\":\"ping\"}\n\n",
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"bash\",\"input\":{}}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\\\":1}\"}}\n\n",
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
    "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":9}}\n\n",
    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
);

const PUNCTUATION: &[u8] = b"{}[]\":,\n\r :data:event:\\0-1e999nulltrue\xff\xc3";

fn mutate(rng: &mut fastrand::Rng, input: &[u8]) -> Vec<u8> {
    let mut bytes = input.to_vec();
    for _ in 0..rng.usize(1..6) {
        if bytes.is_empty() {
            break;
        }
        let at = rng.usize(..bytes.len());
        match rng.u8(..5) {
            0 => bytes[at] = rng.u8(..),
            1 => {
                let end = (at + rng.usize(1..40)).min(bytes.len());
                bytes.drain(at..end);
            }
            2 => {
                let end = (at + rng.usize(1..80)).min(bytes.len());
                let copy = bytes[at..end].to_vec();
                bytes.splice(at..at, copy);
            }
            3 => bytes.insert(at, PUNCTUATION[rng.usize(..PUNCTUATION.len())]),
            _ => bytes.truncate(at),
        }
    }
    bytes
}

/// Runs `input` through the SSE decoder (random chunking) and `decoder`, as the client does.
fn run(rng: &mut fastrand::Rng, input: &[u8], mut decoder: impl WireDecoder) {
    let mut sse = SseDecoder::new();
    let mut assembler = ResponseAssembler::new("m", None);
    let mut rest = input;
    let mut events = Vec::new();
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rng.usize(1..=rest.len().min(64)));
        rest = tail;
        match sse.push(chunk) {
            Ok(more) => events.extend(more),
            Err(_) => return,
        }
    }
    match sse.finish() {
        Ok(last) => events.extend(last),
        Err(_) => return,
    }
    for event in events {
        match decoder.event(event) {
            Ok(out) => out.iter().for_each(|e| assembler.push(e)),
            Err(_) => return,
        }
        if decoder.is_done() {
            break;
        }
    }
    if let Ok(out) = decoder.end() {
        out.iter().for_each(|e| assembler.push(e));
    }
    let _ = assembler.finish();
}

#[test]
fn mutated_streams_and_bodies_never_panic() {
    let mut rng = fastrand::Rng::with_seed(0xCE11A);
    for _ in 0..3000 {
        let input = mutate(&mut rng, OPENAI_STREAM.as_bytes());
        run(&mut rng, &input, ChunkDecoder::new("openai"));
        let _ = openai::decode_response("openai", &input);

        let input = mutate(&mut rng, ANTHROPIC_STREAM.as_bytes());
        run(&mut rng, &input, EventDecoder::new("anthropic"));
        let _ = anthropic::decode_response("anthropic", &input);
    }
}

#[test]
fn unmutated_streams_decode_completely() {
    let mut rng = fastrand::Rng::with_seed(1);
    // Sanity check of the harness: the originals pass through without error.
    let mut sse = SseDecoder::new();
    let events = sse.push(OPENAI_STREAM.as_bytes()).expect("sse");
    let mut decoder = ChunkDecoder::new("openai");
    for event in events {
        decoder.event(event).expect("valid chunk");
    }
    assert!(decoder.is_done());
    run(
        &mut rng,
        ANTHROPIC_STREAM.as_bytes(),
        EventDecoder::new("anthropic"),
    );
}
