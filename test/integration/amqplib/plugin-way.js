// Does with amqplib what code written for the delayed-message-exchange
// plugin does to an exchange, and reports what the broker did, as JSON on
// stdout. The plan comes as JSON on stdin (see migrate_test.go):
//   {"op": "bind", "url", "exchange", "queue", "pattern"}: declares the queue
//     and binds it to the exchange itself, as consumers bound to the
//     plugin's exchange;
//   {"op": "declare", "url", "exchange", "delayedType"}: declares the
//     exchange as the plugin's (x-delayed-message with x-delayed-type), and
//     reports whether the refusal closed the channel or the whole
//     connection.
// Pass or fail is the Go test's call: this script only reports.
'use strict';

const amqp = require('amqplib');
const { readStdin } = require('./stdin');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function bind(plan) {
  const conn = await amqp.connect(plan.url);
  try {
    const ch = await conn.createChannel();
    await ch.assertQueue(plan.queue, { durable: true });
    await ch.bindQueue(plan.queue, plan.exchange, plan.pattern);
    await ch.close();
    return { bound: true };
  } finally {
    await conn.close();
  }
}

async function declare(plan) {
  const res = { declared: false, error: null, code: null, channelClosed: false, connectionClosed: false, connectionError: null };
  const conn = await amqp.connect(plan.url);
  conn.on('error', (e) => { res.connectionError = e.message; });
  conn.on('close', () => { res.connectionClosed = true; });
  const ch = await conn.createChannel();
  ch.on('error', () => {});
  ch.on('close', () => { res.channelClosed = true; });
  try {
    await ch.assertExchange(plan.exchange, 'x-delayed-message',
      { durable: true, arguments: { 'x-delayed-type': plan.delayedType } });
    res.declared = true;
  } catch (e) {
    res.error = e.message;
    res.code = e.code === undefined ? null : e.code;
  }
  await sleep(300);
  // Does the connection still take a channel?
  try {
    const other = await conn.createChannel();
    res.connectionUsable = true;
    await other.close();
  } catch (e) {
    res.connectionUsable = false;
  }
  if (!res.connectionClosed) {
    await conn.close();
  }
  return res;
}

async function main() {
  const plan = JSON.parse(await readStdin());
  const ops = { bind, declare };
  if (!ops[plan.op]) {
    throw new Error(`unknown op ${plan.op}`);
  }
  process.stdout.write(`${JSON.stringify(await ops[plan.op](plan))}\n`);
}

main().catch((err) => {
  process.stderr.write(`amqplib plugin-way: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
