"""FALSE-VFL with explicit typed rounds and secure transports."""
